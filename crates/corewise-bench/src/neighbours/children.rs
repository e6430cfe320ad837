//! CPU-bound neighbour processes, owned by a guard that kills them by PID.
//!
//! Two kinds of neighbour:
//!
//! - [`Neighbours::start`]: `sh -c 'while :; do :; done'`, one busy thread,
//!   no system calls, nothing to install (used by `cores`).
//! - [`Neighbours::start_pools`]: the paper's neighbours for `neighbours`,
//!   other instances of the same application. Each re-executes this binary
//!   as `corewise-bench neighbours --as-neighbour KIND ...` (hidden flags),
//!   which builds the same pool as the measured one ([`serve`]) and keeps
//!   it saturated with `fib(N)` tasks in a closed loop
//!   ([`super::pools::saturate`]). The child prints `ready` once its pool
//!   is up; the parent waits for that line before measuring.
//!
//! The children stay in the benchmark's session (so in its scheduler
//! autogroup, where CFS shares the CPUs per thread, the paper's "fair
//! scheduler" setting). They are stopped by PID (`kill(pid, SIGKILL)` then
//! `waitpid`) when the [`Neighbours`] guard is dropped, which happens on
//! every exit path including errors and panics that unwind.
//! `PR_SET_PDEATHSIG` makes the kernel kill them too if the thread that
//! started them dies without unwinding (SIGKILL, abort; the benchmark
//! starts them from its main thread); a pool neighbour also exits by
//! itself when its parent changes or after `--neighbour-lifetime` seconds.

use super::pools::{neighbour_task, saturate, CorewisePool, Credits, Share, StdPool, Submit};
use super::{optimal_workers, PoolKind};
use crate::error::BenchError;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shell loop each neighbour runs.
pub const SPIN_SCRIPT: &str = "while :; do :; done";

/// Running neighbour processes; dropping the guard kills and reaps them.
#[derive(Debug, Default)]
pub struct Neighbours {
    children: Vec<Child>,
}

/// What a pool neighbour runs (the hidden `--as-neighbour` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSpec {
    /// The pool kind, the same as the measured pool's.
    pub kind: PoolKind,
    /// CPUs of the budget (the parent's, so every process agrees).
    pub cpus: usize,
    /// Processes sharing the machine (neighbours + 1): sizes `optimal`.
    pub processes: usize,
    /// `fib` argument.
    pub n: u32,
    /// How a corewise neighbour measures its share.
    pub share: Share,
    /// Seconds after which the child exits by itself.
    pub lifetime_s: f64,
}

impl PoolSpec {
    /// The arguments after the program name that make a child run `self`.
    pub fn args(&self) -> Vec<String> {
        vec![
            "neighbours".into(),
            "--as-neighbour".into(),
            self.kind.name().into(),
            "--neighbour-cpus".into(),
            self.cpus.to_string(),
            "--neighbour-processes".into(),
            self.processes.to_string(),
            "--fib-n".into(),
            self.n.to_string(),
            "--overcommit".into(),
            self.share.overcommit.to_string(),
            "--share-window-ms".into(),
            self.share.window_ms.to_string(),
            "--share-smoothing".into(),
            self.share.smoothing.to_string(),
            "--neighbour-lifetime".into(),
            self.lifetime_s.to_string(),
        ]
    }

    /// Tasks a neighbour keeps in flight: twice its CPUs, so its queue
    /// (or, for corewise, its cores' run queues) never empties.
    pub fn in_flight(&self) -> usize {
        2 * self.cpus.max(1)
    }
}

/// Spawns `cmd` with the parent-death signal set.
fn spawn(mut cmd: Command, what: &str) -> Result<Child, BenchError> {
    // SAFETY: the closure runs in the forked child before exec and only
    // calls prctl, which is async-signal-safe and touches no memory of the
    // parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| BenchError::io(format!("starting a neighbour ({what})"), e))
}

impl Neighbours {
    /// Starts `n` CPU-bound shell-loop neighbours. On failure the ones
    /// already started are stopped (the guard is dropped) before the error
    /// returns.
    pub fn start(n: usize) -> Result<Self, BenchError> {
        let mut g = Neighbours::default();
        for _ in 0..n {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(SPIN_SCRIPT)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            g.children.push(spawn(cmd, "/bin/sh")?);
        }
        Ok(g)
    }

    /// Starts `n` pool neighbours running `spec` (this executable,
    /// re-executed), and waits until each has printed `ready` (at most
    /// `ready_limit` each). On failure every child started so far is
    /// killed before the error returns.
    pub fn start_pools(
        n: usize,
        spec: &PoolSpec,
        ready_limit: Duration,
    ) -> Result<Self, BenchError> {
        let exe = std::env::current_exe()
            .map_err(|e| BenchError::io("finding the benchmark executable", e))?;
        let mut g = Neighbours::default();
        for _ in 0..n {
            let mut cmd = Command::new(&exe);
            cmd.args(spec.args())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let mut child = spawn(cmd, &exe.display().to_string())?;
            let out = child.stdout.take();
            let pid = child.id();
            // In the guard before waiting: a child that never gets ready is
            // killed with the others.
            g.children.push(child);
            let Some(out) = out else {
                return Err(BenchError::Thread(format!("neighbour {pid}: no stdout")));
            };
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("neighbour-ready".into())
                .spawn(move || {
                    let mut line = String::new();
                    let r = std::io::BufReader::new(out).read_line(&mut line);
                    let _ = tx.send(r.map(|_| line));
                })
                .map_err(|e| BenchError::Thread(format!("neighbour reader: {e}")))?;
            match rx.recv_timeout(ready_limit) {
                Ok(Ok(line)) if line.trim() == "ready" => {}
                Ok(Ok(line)) => {
                    return Err(BenchError::Thread(format!(
                        "neighbour {pid} ({}) did not get ready: {:?}",
                        spec.kind.name(),
                        line.trim()
                    )))
                }
                Ok(Err(e)) => return Err(BenchError::io(format!("reading neighbour {pid}"), e)),
                Err(_) => return Err(BenchError::Timeout("a neighbour's start-up")),
            }
        }
        Ok(g)
    }

    /// CPU time (utime + stime) of each neighbour so far, in seconds;
    /// `None` for one whose `/proc/<pid>/stat` cannot be read.
    pub fn cpu_seconds(&self) -> Vec<Option<f64>> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.children
            .iter()
            .map(|c| {
                let text = std::fs::read_to_string(format!("/proc/{}/stat", c.id())).ok()?;
                pid_stat_ticks(&text).map(|t| t as f64 / hz)
            })
            .collect()
    }

    /// PIDs of the neighbours.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// PIDs of the neighbours that have exited (they are reaped here; a
    /// later [`stop`](Self::stop) sends them nothing).
    pub fn exited(&mut self) -> Vec<u32> {
        self.children
            .iter_mut()
            .filter_map(|c| match c.try_wait() {
                Ok(None) => None,
                _ => Some(c.id()),
            })
            .collect()
    }

    /// Number of neighbours.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Kills every neighbour by PID and reaps it.
    pub fn stop(&mut self) {
        for mut c in self.children.drain(..) {
            // `Child::kill` sends SIGKILL to exactly this PID; it cannot hit
            // a recycled PID because the child is not reaped before `wait`.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        self.stop();
    }
}

/// utime + stime (clock ticks) from the text of `/proc/<pid>/stat`:
/// fields 14 and 15, counted after the last `)` (the command name may hold
/// spaces and parentheses).
pub fn pid_stat_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state), so field k is f[k - 3].
    let u: u64 = f.get(11)?.parse().ok()?;
    let s: u64 = f.get(12)?.parse().ok()?;
    Some(u.saturating_add(s))
}

/// The child side of [`Neighbours::start_pools`]: builds the pool `spec`
/// asks for, prints `ready`, and keeps [`PoolSpec::in_flight`] `fib(n)`
/// tasks in it until it is killed, its parent goes away, or
/// `spec.lifetime_s` has passed. Never returns normally: it exits the
/// process without waiting for the pool.
pub fn serve(spec: &PoolSpec) -> Result<(), BenchError> {
    let parent = std::os::unix::process::parent_id();
    let credits = Arc::new(Credits::default());
    let task = neighbour_task(&credits, spec.n);
    let mut pool: Box<dyn Submit> = match spec.kind {
        PoolKind::Ignorant => Box::new(StdPool::start(spec.cpus, &task)?),
        PoolKind::Optimal => Box::new(StdPool::start(
            optimal_workers(spec.cpus, spec.processes.saturating_sub(1)),
            &task,
        )?),
        PoolKind::Corewise => Box::new(CorewisePool::start(&task, Some(spec.share))?),
    };
    println!("ready");
    let deadline = Instant::now() + Duration::from_secs_f64(spec.lifetime_s.clamp(1.0, 3600.0));
    saturate(&mut *pool, &credits, spec.in_flight(), || {
        Instant::now() < deadline && std::os::unix::process::parent_id() == parent
    })?;
    // Killed neighbours never get here; one that outlived its parent or
    // its lifetime leaves without draining.
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_neighbours_are_reported() {
        let mut g = Neighbours::start(2).expect("start");
        assert!(g.exited().is_empty());
        let pid = g.pids()[0];
        // SAFETY: `pid` is our own child, not reaped yet (no recycling).
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
        let start = Instant::now();
        let mut dead = Vec::new();
        while dead.is_empty() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
            dead = g.exited();
        }
        assert_eq!(dead, vec![pid]);
        assert!(g.cpu_seconds()[1].is_some());
    }

    #[test]
    fn stat_ticks_after_the_name() {
        let text = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 1 0 5 0 0\n";
        assert_eq!(pid_stat_ticks(text), Some(21));
        assert_eq!(pid_stat_ticks("42 (x) S 1 2"), None);
        assert_eq!(pid_stat_ticks(""), None);
    }

    #[test]
    fn spec_round_trips_through_the_command_line() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: Sub,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Neighbours(super::super::Args),
        }
        let spec = PoolSpec {
            kind: PoolKind::Optimal,
            cpus: 2,
            processes: 3,
            n: 27,
            share: Share {
                overcommit: 1.5,
                window_ms: 25.0,
                smoothing: 0.5,
            },
            lifetime_s: 60.0,
        };
        let mut argv = vec!["corewise-bench".to_string()];
        argv.extend(spec.args());
        let Sub::Neighbours(a) = Cli::try_parse_from(argv).expect("parse").cmd;
        assert_eq!(a.pool_spec(), Some(spec));
    }

    fn alive(pid: u32) -> bool {
        // A reaped child has no /proc entry (a zombie would still have one,
        // but `stop` reaps).
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn guard_kills_children_by_pid() {
        let pids = {
            let g = Neighbours::start(2).expect("start");
            assert_eq!(g.len(), 2);
            let pids = g.pids();
            assert!(pids.iter().all(|&p| alive(p)));
            pids
        };
        assert!(pids.iter().all(|&p| !alive(p)));
    }
}
