//! `corewise-bench core-grant`: how long it takes to obtain a core from the
//! core arbiter (Arachne's Figure 8).
//!
//! Latency is measured end to end, from the moment an application calls
//! `set_requested_cores` until a kernel thread of that application runs on
//! the newly granted core (it stamps the time as soon as
//! `block_until_core_available` returns, and checks `sched_getcpu`):
//!
//! - (a) `free_core`: the managed core is idle (released 100 µs before);
//!   the cost is moving the thread into the core's cpuset and waking it.
//!   The daemon keeps a just-freed core in the polling idle state for its
//!   warm window (1 ms by default, see `corewise_arbiter::warm`), so this
//!   is the grant of a core the load gave back a moment ago.
//! - (a') `free_core_cold`: the same after the core has been free for 5 ms,
//!   past the window: the wake-up then waits for the CPU to leave its deep
//!   idle state (on a VM, for the host to run the halted vCPU again). Not
//!   part of the targets, reported so the price of a cold core is visible.
//! - (b) `reclaim`: the core is held by a lower-priority application whose
//!   kernel thread polls `must_release_core` (as a dispatcher would); the
//!   cost adds the round trip through the shared page and its release.
//!
//! The daemon gets two physical cores: the first CPU's (unmanaged, as one
//! always is) and the last CPU's with its hyperthread siblings (managed), so
//! exactly one core is managed whatever the machine: both scenarios only
//! ever need that one core, and the reclaim scenario relies on it (with a
//! second managed core the high-priority application would get that one
//! instead of reclaiming). On a 2-CPU machine these are simply its two. The benchmark creates its own cpuset subtree
//! (cgroup v1, or cgroup v2 where the daemon builds a threaded subtree; see
//! [`crate::cpuset`]), moves itself into it (so the daemon puts all its
//! other threads on the unmanaged core), runs the daemon on a thread of its
//! own, and removes everything afterwards. It needs root.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use corewise_arbiter::client::{Client, ClientError};
use corewise_arbiter::daemon::{self, DaemonError, Options};
use corewise_arbiter::topology::{CpuList, Topology};

use crate::cpuset::{Subtree, SubtreeError};
use serde::Serialize;

/// Command-line arguments of `core-grant`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CoreGrantArgs {
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fewer samples (1000 per scenario) so the run stays well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Grants measured per scenario (a fifth of it for the cold one);
    /// overrides `--quick`. A smoke run (an emulated guest) takes few.
    #[arg(long, value_parser = clap::value_parser!(u32).range(10..))]
    pub samples: Option<u32>,
}

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum CoreGrantError {
    /// The machine cannot run it.
    #[error("core-grant needs {0}")]
    Unsupported(String),
    /// cgroup file operations failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The daemon failed.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// A client call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Something did not happen as the protocol says.
    #[error("benchmark protocol: {0}")]
    Protocol(String),
    /// Writing the JSON failed.
    #[error("writing JSON: {0}")]
    Json(String),
}

/// Summary of one scenario (microseconds).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    /// Median latency.
    pub median_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Number of grants measured.
    pub samples: usize,
}

/// The benchmark's result (also its JSON).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CoreGrantReport {
    /// A free core is granted (freed 100 µs before).
    pub free_core: Latency,
    /// A free core that has been idle past the daemon's warm window.
    pub free_core_cold: Latency,
    /// The core must first be reclaimed from a lower-priority application.
    pub reclaim: Latency,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CoreGrantError + 'a {
    move |source| CoreGrantError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What a kernel thread reports to the driver.
enum Event {
    /// Granted `core`, running on `cpu`, at `at`.
    Granted { core: u32, cpu: u32, at: Instant },
    /// The thread failed.
    Failed(String),
}

/// A kernel thread that takes cores, spins on `must_release_core` like a
/// dispatcher, and gives them back when asked.
fn worker(client: Client, tx: mpsc::Sender<Event>) {
    let mut me = match client.thread() {
        Ok(t) => t,
        Err(e) => {
            let _ = tx.send(Event::Failed(e.to_string()));
            return;
        }
    };
    loop {
        let core = match me.block_until_core_available() {
            Ok(c) => c,
            Err(ClientError::DaemonGone) => return,
            Err(e) => {
                let _ = tx.send(Event::Failed(e.to_string()));
                return;
            }
        };
        let at = Instant::now();
        let cpu = rustix::thread::sched_getcpu() as u32;
        if tx.send(Event::Granted { core, cpu, at }).is_err() {
            return;
        }
        while !me.must_release_core() {
            std::hint::spin_loop();
        }
    }
}

fn next_grant(rx: &mpsc::Receiver<Event>) -> Result<(u32, Instant), CoreGrantError> {
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Event::Granted { core, cpu, at }) => {
            if core != cpu {
                return Err(CoreGrantError::Protocol(format!(
                    "granted core {core} but running on CPU {cpu}"
                )));
            }
            Ok((core, at))
        }
        Ok(Event::Failed(e)) => Err(CoreGrantError::Protocol(format!("worker failed: {e}"))),
        Err(_) => Err(CoreGrantError::Protocol("no grant within 10 s".into())),
    }
}

/// Waits (without spinning on the unmanaged core) until `client` holds no core.
fn wait_released(client: &Client, idle: Duration) -> Result<(), CoreGrantError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !client.owned_cores().is_empty() {
        if Instant::now() > deadline {
            return Err(CoreGrantError::Protocol(
                "core not released within 10 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    // The core sits idle for a while, as a free core would.
    std::thread::sleep(idle);
    Ok(())
}

fn summarize(mut us: Vec<f64>) -> Latency {
    us.sort_by(|a, b| a.total_cmp(b));
    let n = us.len();
    let pick = |q: f64| -> f64 {
        if n == 0 {
            return 0.0;
        }
        let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        us[i]
    };
    Latency {
        median_us: pick(0.5),
        p99_us: pick(0.99),
        samples: n,
    }
}

const PAUSE: Duration = Duration::from_micros(100);
/// Longer than the daemon's default warm window.
const COLD: Duration = Duration::from_millis(5);
const HIGH: [u32; 8] = [1, 0, 0, 0, 0, 0, 0, 0];
const LOW: [u32; 8] = [0, 0, 0, 0, 0, 0, 0, 1];
const NONE: [u32; 8] = [0; 8];

fn free_core(socket: &Path, n: usize, idle: Duration) -> Result<Vec<f64>, CoreGrantError> {
    let app = Client::connect(socket)?;
    let (tx, rx) = mpsc::channel();
    let c = app.clone();
    let t = std::thread::spawn(move || worker(c, tx));
    std::thread::sleep(Duration::from_millis(20));
    let mut out = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t0 = Instant::now();
        app.set_requested_cores(HIGH)?;
        let (_, t1) = next_grant(&rx)?;
        if i >= n / 10 {
            // The first tenth warms caches and is not recorded.
            out.push(t1.duration_since(t0).as_secs_f64() * 1e6);
        }
        app.set_requested_cores(NONE)?;
        wait_released(&app, idle)?;
    }
    drop(app);
    drop(rx);
    let _ = t;
    Ok(out)
}

fn reclaim(socket: &Path, n: usize) -> Result<Vec<f64>, CoreGrantError> {
    let low = Client::connect(socket)?;
    let high = Client::connect(socket)?;
    let (ltx, lrx) = mpsc::channel();
    let (htx, hrx) = mpsc::channel();
    let (lc, hc) = (low.clone(), high.clone());
    std::thread::spawn(move || worker(lc, ltx));
    std::thread::spawn(move || worker(hc, htx));
    std::thread::sleep(Duration::from_millis(20));
    low.set_requested_cores(LOW)?;
    next_grant(&lrx)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        // Let the low application's thread settle into its polling loop.
        std::thread::sleep(PAUSE);
        let t0 = Instant::now();
        high.set_requested_cores(HIGH)?;
        let (_, t1) = next_grant(&hrx)?;
        if i >= n / 10 {
            out.push(t1.duration_since(t0).as_secs_f64() * 1e6);
        }
        // Give it back; the low application gets it again.
        high.set_requested_cores(NONE)?;
        next_grant(&lrx)?;
    }
    Ok(out)
}

fn pin(cpus: &[u32]) -> Result<(), CoreGrantError> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        set.set(c as usize);
    }
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| CoreGrantError::Protocol(format!("sched_setaffinity: {e}")))
}

/// The floor under both scenarios: waking a thread sleeping in `read` on
/// another core through a Unix socket, with no arbiter involved.
fn reference_wake(from: u32, to: u32, n: usize) -> Result<Latency, CoreGrantError> {
    use std::io::{Read, Write};
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| CoreGrantError::Protocol(format!("socketpair: {e}")))?;
    let (tx, rx) = mpsc::channel::<Instant>();
    let t = std::thread::spawn(move || {
        if pin(&[to]).is_err() {
            return;
        }
        let mut buf = [0u8; 1];
        while let Ok(1) = b.read(&mut buf) {
            if tx.send(Instant::now()).is_err() {
                return;
            }
        }
    });
    let before = rustix::thread::sched_getaffinity(None)
        .map_err(|e| CoreGrantError::Protocol(format!("sched_getaffinity: {e}")))?;
    pin(&[from])?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(PAUSE);
        let t0 = Instant::now();
        if a.write_all(b"x").is_err() {
            break;
        }
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(t1) => out.push(t1.duration_since(t0).as_secs_f64() * 1e6),
            Err(_) => break,
        }
    }
    drop(a);
    let _ = t.join();
    let _ = rustix::thread::sched_setaffinity(None, &before);
    Ok(summarize(out))
}

fn subtree_error(e: SubtreeError) -> CoreGrantError {
    match e {
        SubtreeError::Unsupported(why) => CoreGrantError::Unsupported(why),
        SubtreeError::Io { op, path, source } => CoreGrantError::Io { op, path, source },
    }
}

/// Runs the benchmark, prints a table, and writes JSON if asked.
pub fn run(args: CoreGrantArgs) -> Result<CoreGrantReport, CoreGrantError> {
    let n = match args.samples {
        Some(n) => n as usize,
        None if args.quick => 1000,
        None => 5000,
    };
    let online = corewise_arbiter::topology::online_cpus();
    let topo = Topology::read(&online);
    // The last CPU that is not a hyperthread sibling of the first.
    let first = online.cores().next();
    let last = first.and_then(|f| {
        online
            .cores()
            .filter(|&c| c != f && !topo.are_siblings(f, c))
            .last()
    });
    let (Some(first), Some(last)) = (first, last) else {
        return Err(CoreGrantError::Unsupported(
            "at least 2 physical cores".into(),
        ));
    };
    let floor = reference_wake(first, last, n.min(1000))?;
    let subtree = Subtree::create().map_err(subtree_error)?;
    let held = subtree.cpus().map_err(subtree_error)?;
    let cpus: CpuList = topo
        .siblings(first)
        .into_iter()
        .chain(topo.siblings(last))
        .filter(|&c| held.contains(c as usize))
        .collect();
    let socket = std::env::temp_dir().join(format!("corewise-bench-{}.sock", std::process::id()));
    let d = daemon::spawn(Options {
        socket: socket.clone(),
        backend: subtree.backend(),
        cgroup_root: Some(subtree.dir.clone()),
        cpus: Some(cpus),
        // As the systemd unit does: a busy unmanaged core must not delay grants.
        rt_priority: Some(10),
        ..Options::default()
    })?;
    let result = free_core(&socket, n, PAUSE).and_then(|a| {
        let cold = free_core(&socket, n / 5, COLD)?;
        Ok((a, cold, reclaim(&socket, n)?))
    });
    d.stop()?;
    drop(subtree);
    let (a, cold, b) = result?;
    let report = CoreGrantReport {
        free_core: summarize(a),
        free_core_cold: summarize(cold),
        reclaim: summarize(b),
    };
    println!(
        "core-grant: latency from set_requested_cores to a thread running on the granted core"
    );
    println!(
        "{:<12} {:>10} {:>10} {:>8}",
        "scenario", "median_us", "p99_us", "samples"
    );
    for (name, l) in [
        ("free_core", report.free_core),
        ("reclaim", report.reclaim),
        ("free_cold", report.free_core_cold),
    ] {
        println!(
            "{:<12} {:>10.1} {:>10.1} {:>8}",
            name, l.median_us, l.p99_us, l.samples
        );
    }
    println!(
        "{:<12} {:>10.1} {:>10.1} {:>8}   (reference: cross-core wake-up through a socket, no arbiter)",
        "wake_floor", floor.median_us, floor.p99_us, floor.samples
    );
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CoreGrantError::Json(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(io("write", path))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let l = summarize((1..=100).map(f64::from).collect());
        assert_eq!(l.median_us, 50.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.samples, 100);
        assert_eq!(summarize(vec![]).samples, 0);
    }
}
