//! The servers under test: started confined to one CPU, stopped by PID.
//!
//! Confinement is `sched_setaffinity` in the child between fork and exec,
//! so every thread either server ever creates inherits the one CPU
//! (setting it after start would miss threads already pinned elsewhere).
//! memcached also gets `-t 1` (one worker thread); corewise-kv gets
//! `-t 1 --cpus <cpu>`, so its runtime holds exactly that core. With the
//! arbiter daemon (`kv --neighbour`), corewise-kv is not pinned: the daemon
//! grants it the core.

use crate::error::BenchError;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server; dropping it kills it by PID and reaps it.
#[derive(Debug)]
pub struct Server {
    /// Display name.
    pub name: &'static str,
    /// Port on 127.0.0.1.
    pub port: u16,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's PID; it is not reaped yet (we
        // hold the Child), so the PID cannot have been reused.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Server {
    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server (SIGSTOP) until the guard is dropped (SIGCONT).
    ///
    /// The servers share one CPU and are measured in turn; the idle one
    /// must not run meanwhile: memcached's LRU maintainer, still working
    /// off the last burst of sets, took the CPU for up to 5 ms at a time
    /// while corewise-kv was being measured (perf sched timehist).
    pub fn pause(&self) -> Result<Paused<'_>, BenchError> {
        self.signal(libc::SIGSTOP)?;
        Ok(Paused(self))
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), BenchError> {
        // SAFETY: kill(2) on our own child's PID; it is not reaped yet (we
        // hold the Child), so the PID cannot have been reused.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, sig) } == 0 {
            Ok(())
        } else {
            Err(BenchError::io(
                format!("signalling {} (pid {})", self.name, self.child.id()),
                std::io::Error::last_os_error(),
            ))
        }
    }
}

/// A [`Server`] stopped by [`Server::pause`]; dropping this continues it.
#[derive(Debug)]
pub struct Paused<'a>(&'a Server);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let _ = self.0.signal(libc::SIGCONT);
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16, BenchError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::io("finding a free port", e))
}

fn start(
    name: &'static str,
    mut cmd: Command,
    cpu: Option<usize>,
    port: u16,
) -> Result<Server, BenchError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: runs in the forked child before exec; it only makes the
    // sched_setaffinity and prctl system calls on a stack-local CPU set.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(cpu) = cpu {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| BenchError::io(format!("starting {name}"), e))?;
    let mut s = Server { name, port, child };
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(st)) = s.child.try_wait() {
            return Err(BenchError::Machine(format!("{name} exited at start: {st}")));
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(BenchError::Timeout("server start"))
}

/// Starts corewise-kv on `cpu`: pinned there, or, with `arbiter` (the
/// daemon's socket and the CPUs it manages), taking one core from the
/// daemon. Then the runtime gets a kernel thread per CPU of the daemon and
/// `-t 1`: its floor kernel thread runs in the unmanaged set only until the
/// daemon grants the managed core, which its other kernel thread takes.
pub fn corewise_kv(
    bin: &PathBuf,
    cpu: usize,
    mode: Option<&str>,
    extra: &[String],
    arbiter: Option<(&std::path::Path, &str)>,
    max_conns: usize,
) -> Result<Server, BenchError> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args([
        "-p",
        &port.to_string(),
        "-l",
        "127.0.0.1",
        "-m",
        "64",
        "-t",
        "1",
        "-c",
        &max_conns.to_string(),
    ])
    .args([
        "--cpus",
        &arbiter.map_or_else(|| cpu.to_string(), |(_, cpus)| cpus.to_string()),
    ]);
    if let Some(m) = mode {
        cmd.args(["--mode", m]);
    }
    if let Some((socket, _)) = arbiter {
        cmd.arg("--arbiter").arg(socket);
    }
    cmd.args(extra);
    start(
        "corewise-kv",
        cmd,
        if arbiter.is_some() { None } else { Some(cpu) },
        port,
    )
}

/// Starts memcached (`-t 1 -U 0 -m 64 -c max_conns`) on `cpu`.
pub fn memcached(bin: &PathBuf, cpu: usize, max_conns: usize) -> Result<Server, BenchError> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args([
        "-c",
        &max_conns.to_string(),
        "-t",
        "1",
        "-p",
        &port.to_string(),
        "-l",
        "127.0.0.1",
        "-m",
        "64",
        "-U",
        "0",
    ]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.args(["-u", "root"]);
    }
    start("memcached", cmd, Some(cpu), port)
}
