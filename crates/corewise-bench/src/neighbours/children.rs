//! CPU-bound neighbour processes, owned by a guard that kills them by PID.
//!
//! A neighbour is `sh -c 'while :; do :; done'`: one busy thread, no
//! system calls, nothing to install. The children stay in the benchmark's
//! session (so in its scheduler autogroup, where CFS shares the CPUs per
//! thread, the paper's "fair scheduler" setting). They are stopped by PID
//! (`kill(pid, SIGKILL)` then `waitpid`) when the [`Neighbours`] guard is
//! dropped, which happens on every exit path including errors and panics
//! that unwind; `PR_SET_PDEATHSIG` makes the kernel kill them too if the
//! benchmark itself dies without unwinding (SIGKILL, abort).

use crate::error::BenchError;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// The shell loop each neighbour runs.
pub const SPIN_SCRIPT: &str = "while :; do :; done";

/// Running neighbour processes; dropping the guard kills and reaps them.
#[derive(Debug, Default)]
pub struct Neighbours {
    children: Vec<Child>,
}

impl Neighbours {
    /// Starts `n` CPU-bound neighbours. On failure the ones already started
    /// are stopped (the guard is dropped) before the error returns.
    pub fn start(n: usize) -> Result<Self, BenchError> {
        let mut g = Neighbours::default();
        for _ in 0..n {
            let mut cmd = Command::new("/bin/sh");
            cmd.arg("-c")
                .arg(SPIN_SCRIPT)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // SAFETY: the closure runs in the forked child before exec and
            // only calls prctl, which is async-signal-safe and touches no
            // memory of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .map_err(|e| BenchError::io("starting a neighbour (/bin/sh)", e))?;
            g.children.push(child);
        }
        Ok(g)
    }

    /// PIDs of the neighbours.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

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
