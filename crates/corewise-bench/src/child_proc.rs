//! Child processes with a deadline: the benchmarks run each runtime in a
//! child of this program so that one that hangs (or cannot shut down) is
//! killed by its PID instead of hanging the whole benchmark.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How a child ended without giving an [`Output`].
#[derive(Debug)]
pub enum ChildFailure {
    /// It could not be started.
    Start(std::io::Error),
    /// It had not exited at the deadline and was killed.
    Killed(Duration),
}

impl std::fmt::Display for ChildFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildFailure::Start(e) => write!(f, "cannot start child: {e}"),
            ChildFailure::Killed(t) => {
                write!(f, "no result within {} s (child killed)", t.as_secs())
            }
        }
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) and returns its
/// output, or kills it when it has not exited within `timeout`.
///
/// Both pipes are read on threads of their own, so a chatty child never
/// blocks on a full pipe while we wait.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Result<Output, ChildFailure> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ChildFailure::Start)?;
    let drain = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    let so = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let se = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ChildFailure::Killed(timeout));
            }
        }
    };
    Ok(Output {
        status,
        stdout: so.join().unwrap_or_default(),
        stderr: se.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_of_a_child_that_exits() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = output_within(c, Duration::from_secs(30)).expect("output");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_child_past_its_deadline_is_killed() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let t = Instant::now();
        let r = output_within(c, Duration::from_millis(100));
        assert!(matches!(r, Err(ChildFailure::Killed(_))), "{r:?}");
        // Killed, not waited for: far less than the child's 30 s.
        assert!(t.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_missing_program_cannot_start() {
        let r = output_within(
            Command::new("/nonexistent/corewise-bench-child"),
            Duration::from_secs(1),
        );
        assert!(matches!(r, Err(ChildFailure::Start(_))), "{r:?}");
    }
}
