//! The `connections` scenario: thread-per-connection echo servers, each in
//! its own child process (corewise: [`serve_tpc`], a user thread per
//! connection; tokio and the epoll loop: the `echo` benchmark's servers;
//! Go: bench/go-threads, a goroutine per connection) with many
//! connections open and some of them active at a fixed total rate.
//!
//! The load generator runs in another child process (`--load`), so the
//! server and the generator never share a process. It opens every
//! connection, then sends 64-byte requests round-robin over the first
//! `active` ones on an open-loop schedule (latency runs from the scheduled
//! send time, so a slow server is not hidden by a late send), one request
//! in flight at a time. Server RSS is the server's VmHWM, read from
//! `/proc/PID/status` just before it is stopped.

use super::Outcome;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generator side: `PORT:CONNS:ACTIVE:RATE:MILLIS` → outcome with p50/p99.
pub fn load(spec: &str) -> Outcome {
    let v: Vec<u64> = spec.split(':').filter_map(|p| p.parse().ok()).collect();
    let mut out = Outcome::default();
    let [port, conns, active, rate, millis] = v[..] else {
        out.error = Some(format!("bad load spec {spec:?}"));
        return out;
    };
    out.n = conns as usize;
    let mut streams = match crate::echo::load::connect(port as u16, conns as usize) {
        Ok(s) => s,
        Err(e) => {
            out.error = Some(format!("failed: connecting {conns}: {e}"));
            return out;
        }
    };
    let active = (active as usize).clamp(1, streams.len().max(1));
    let gap = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let (mut buf, msg) = ([0u8; 64], [7u8; 64]);
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let mut next = t0;
    let mut i = 0;
    while t0.elapsed() < Duration::from_millis(millis) {
        while Instant::now() < next {
            std::hint::spin_loop();
        }
        let s = &mut streams[i % active];
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if let Err(e) = s.write_all(&msg).and_then(|_| s.read_exact(&mut buf)) {
            out.error = Some(format!("failed: connection {}: {e}", i % active));
            return out;
        }
        lat.push(next.elapsed().as_secs_f64() * 1e6);
        next += gap;
        i += 1;
    }
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p) as usize).copied();
    out.p50_us = q(0.5);
    out.p99_us = q(0.99);
    out
}

/// The CPU every echo server runs on: the last one this process may use.
pub fn server_cpu() -> usize {
    crate::affinity::allowed_cpus()
        .ok()
        .and_then(|c| c.last().copied())
        .unwrap_or(0)
}

/// The command that starts this program's echo server `server` on `cpu`.
pub fn server_command(exe: &Path, server: &str, cpu: usize, conns: usize) -> Command {
    let mut c = Command::new(exe);
    if server.starts_with("corewise") {
        c.args(["threads", "--serve-tpc", &format!("{server}:{cpu}")]);
    } else {
        c.args(["echo", "--serve", &format!("{server}:{cpu}:{conns}")]);
    }
    c
}

/// Makes the process `cmd` starts run on `cpu` only (all its threads: they
/// inherit the affinity of the thread that execs).
pub fn pin_child(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and only makes
    // one system call (sched_setaffinity) on a set built on its stack: no
    // allocation, no lock, nothing that is unsafe after fork.
    unsafe {
        cmd.pre_exec(move || {
            let mut set = rustix::thread::CpuSet::new();
            set.set(cpu);
            rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
        });
    }
}

/// Runs the server `serve` starts in a child (it prints its port on its
/// first stdout line) and the generator in another.
pub fn measure(mut serve: Command, conns: usize, active: usize, rate: u64, millis: u64) -> Outcome {
    let fail = |e: String| Outcome {
        error: Some(e),
        n: conns,
        ..Outcome::default()
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("failed: {e}")),
    };
    let mut child = match serve
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return fail(format!("failed: spawn server: {e}")),
    };
    let pid = child.id();
    let mut line = String::new();
    if let Some(o) = child.stdout.take() {
        let _ = BufReader::new(o).read_line(&mut line);
    }
    let mut out = match line.trim().parse::<u16>() {
        Ok(port) => {
            let res = Command::new(&exe)
                .args([
                    "threads",
                    "--load",
                    &format!("{port}:{conns}:{active}:{rate}:{millis}"),
                ])
                .stdin(Stdio::null())
                .output();
            match res {
                Ok(o) => String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .last()
                    .and_then(|l| serde_json::from_str::<Outcome>(l).ok())
                    .unwrap_or_else(|| fail(format!("failed: generator exited with {}", o.status))),
                Err(e) => fail(format!("failed: spawn generator: {e}")),
            }
        }
        Err(_) => fail("failed: server printed no port".into()),
    };
    out.n = conns;
    out.peak_rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        });
    // A server that stopped explains the generator's failure: its own
    // one-line reason (a spawn that failed, with the count reached) wins.
    if let Ok(Some(st)) = child.try_wait() {
        let mut why = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut why);
        }
        let why = why.lines().last().unwrap_or("").trim().to_string();
        out.error = Some(format!("failed: server exited with {st}: {why}"));
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}

/// A corewise thread-per-connection echo server on `cpu` (`KIND:CPU`, KIND
/// corewise-uring or corewise-epoll): prints its port, then spawns one user
/// thread per accepted connection. A spawn that fails is printed to stderr
/// with the count reached and ends the process with status 3.
pub fn serve_tpc(spec: &str) -> ! {
    let (kind, cpu) = spec.split_once(':').unwrap_or((spec, "0"));
    let backend = if kind == "corewise-epoll" {
        corewise::IoBackend::Epoll
    } else {
        corewise::IoBackend::Uring
    };
    let fail = |what: String| -> ! {
        eprintln!("{what}");
        std::process::exit(3)
    };
    let rt = corewise::Runtime::builder()
        .cpus([cpu.parse().unwrap_or(0)])
        .io_backend(backend)
        .neighbour_awareness(None)
        .build()
        .unwrap_or_else(|e| fail(format!("runtime: {e}")));
    let l = corewise::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| fail(format!("bind: {e}")));
    match l.local_addr() {
        Ok(a) => println!("{}", a.port()),
        Err(e) => fail(format!("local_addr: {e}")),
    }
    let res = rt.block_on(move || {
        for i in 0.. {
            let (mut s, _) = match l.accept() {
                Ok(c) => c,
                Err(e) => return format!("accept after {i} connections: {e}"),
            };
            let _ = s.set_nodelay(true);
            let spawned = corewise::spawn(move || {
                let mut buf = [0u8; 64];
                while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
            });
            if let Err(e) = spawned {
                return format!("spawn after {i} connection threads: {e}");
            }
        }
        String::new()
    });
    match res {
        Ok(e) => fail(format!("server stopped: {e}")),
        Err(e) => fail(format!("server: {e}")),
    }
}
