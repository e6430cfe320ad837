//! The `connections` scenario: thread-per-connection echo servers, each in
//! its own child process (corewise: [`serve_tpc`], a user thread per
//! connection; tokio and the epoll loop: the `echo` benchmark's servers;
//! Go: bench/go-threads, a goroutine per connection) with many
//! connections open and some of them active at a fixed total rate.
//!
//! The load generator runs in another child process (`--load`), so the
//! server and the generator never share a process, pinned to the first CPU
//! while every server is held to the last one, whole. It opens every
//! connection, then sends 64-byte requests round-robin over the first
//! `active` ones on an open-loop schedule, through one epoll set: at most
//! `--in-flight` requests out per connection (pipelined), a due request
//! beyond that waits for a reply, and every latency runs from the scheduled
//! send time, so neither a slow server nor a late send is hidden. Server RSS is the server's VmHWM, read from
//! `/proc/PID/status` just before it is stopped.

use super::Outcome;
use rustix::event::epoll;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One active connection of the generator.
struct Conn {
    s: TcpStream,
    /// Scheduled send times of the requests sent and not yet answered.
    in_flight: VecDeque<Instant>,
    /// Scheduled send times of due requests not sent yet (the connection
    /// already had `in_flight` requests out).
    due: VecDeque<Instant>,
    /// Bytes of the next reply received so far.
    got: usize,
}

impl Conn {
    /// Sends due requests while fewer than `k` are in flight.
    fn flush(&mut self, k: usize, msg: &[u8; MSG]) -> std::io::Result<()> {
        while self.in_flight.len() < k {
            let Some(at) = self.due.pop_front() else {
                break;
            };
            // 64 bytes into a send buffer holding at most `k` requests: it
            // is written whole or, when the buffer is full, not at all.
            match (&self.s).write(msg) {
                Ok(MSG) => self.in_flight.push_back(at),
                Ok(n) => {
                    return Err(std::io::Error::other(format!(
                        "short write ({n} of {MSG} bytes)"
                    )))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.due.push_front(at);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

const MSG: usize = 64;
/// Replies still missing this long after the window are a failure.
const DRAIN: Duration = Duration::from_secs(2);
/// Closer to a send time than this, the generator polls instead of sleeping
/// in `epoll_wait`, so sends leave on time (a timer wake-up can be late by
/// the timer slack, 50 µs by default, and by the scheduler).
const SPIN: Duration = Duration::from_micros(100);

/// Generator side: `PORT:CONNS:ACTIVE:RATE:MILLIS:IN_FLIGHT` → outcome
/// with p50/p99.
pub fn load(spec: &str) -> Outcome {
    let v: Vec<u64> = spec.split(':').filter_map(|p| p.parse().ok()).collect();
    let mut out = Outcome::default();
    let [port, conns, active, rate, millis, k] = v[..] else {
        out.error = Some(format!("bad load spec {spec:?}"));
        return out;
    };
    out.n = conns as usize;
    let streams = match crate::echo::load::connect(port as u16, conns as usize) {
        Ok(s) => s,
        Err(e) => {
            out.error = Some(format!("failed: connecting {conns}: {e}"));
            return out;
        }
    };
    match drive(streams, active as usize, rate, millis, k.max(1) as usize) {
        Ok(mut lat) => {
            lat.sort_by(f64::total_cmp);
            let q = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p) as usize).copied();
            out.p50_us = q(0.5);
            out.p99_us = q(0.99);
            out.latencies_us = lat.iter().map(|&l| l as f32).collect();
        }
        Err(e) => out.error = Some(format!("failed: {e}")),
    }
    out
}

/// The open-loop schedule: request `i` is due at `t0 + i / rate` on active
/// connection `i % active`, and is sent then if that connection has fewer
/// than `k` requests in flight, else as soon as a reply frees a place.
/// Every latency runs from the due time, so a server (or a generator) that
/// falls behind shows in the figures instead of slowing the schedule down
/// (no coordinated omission). Returns the latencies in µs; the connections
/// beyond `active` stay open and idle until it returns.
fn drive(
    streams: Vec<TcpStream>,
    active: usize,
    rate: u64,
    millis: u64,
    k: usize,
) -> std::io::Result<Vec<f64>> {
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let active = active.clamp(1, streams.len().max(1));
    let mut conns = Vec::with_capacity(active);
    let mut idle = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        if i >= active {
            idle.push(s);
            continue;
        }
        crate::echo::load::watch(&ep, &s, i)?;
        conns.push(Conn {
            s,
            in_flight: VecDeque::new(),
            due: VecDeque::new(),
            got: 0,
        });
    }
    let gap = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let msg = [7u8; MSG];
    let mut buf = [0u8; 4096];
    let mut events = Vec::with_capacity(1024);
    let mut lat = Vec::new();
    let t0 = Instant::now();
    let end = t0 + Duration::from_millis(millis);
    let (mut next, mut i, mut pending) = (t0, 0usize, 0usize);
    loop {
        let now = Instant::now();
        while next <= now && next < end {
            let c = &mut conns[i % active];
            c.due.push_back(next);
            c.flush(k, &msg)?;
            pending += 1;
            next += gap;
            i += 1;
        }
        if next >= end && pending == 0 {
            break;
        }
        if now > end + DRAIN {
            return Err(std::io::Error::other(format!(
                "{pending} requests unanswered {} s after the window",
                DRAIN.as_secs()
            )));
        }
        // epoll_wait counts its timeout in whole milliseconds (rounded
        // up): sleep only for the whole milliseconds before the next send
        // and poll for the rest.
        let wait = if next < end {
            let left = next.saturating_duration_since(now).saturating_sub(SPIN);
            Duration::from_millis(left.as_millis() as u64)
        } else {
            Duration::from_millis(10)
        };
        let ts = rustix::time::Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        };
        events.clear();
        epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), Some(&ts))?;
        for ev in events.iter() {
            let idx = ev.data.u64() as usize;
            let c = &mut conns[idx];
            loop {
                match (&c.s).read(&mut buf) {
                    Ok(0) => {
                        return Err(std::io::Error::other(format!(
                            "server closed connection {idx}"
                        )))
                    }
                    Ok(n) => {
                        c.got += n;
                        let t = Instant::now();
                        while c.got >= MSG {
                            c.got -= MSG;
                            let Some(at) = c.in_flight.pop_front() else {
                                return Err(std::io::Error::other(format!(
                                    "connection {idx}: a reply to no request"
                                )));
                            };
                            lat.push((t - at).as_secs_f64() * 1e6);
                            pending -= 1;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(std::io::Error::other(format!("connection {idx}: {e}"))),
                }
            }
            c.flush(k, &msg)?;
        }
    }
    drop(idle);
    Ok(lat)
}

/// The CPU every echo server runs on: the last one this process may use.
pub fn server_cpu() -> usize {
    crate::affinity::allowed_cpus()
        .ok()
        .and_then(|c| c.last().copied())
        .unwrap_or(0)
}

/// The CPU the load generator runs on: the first one this process may use,
/// as in the `echo` benchmark, when that is not the server's (`None` on a
/// single CPU: the two then share it).
pub fn load_cpu() -> Option<usize> {
    let first = crate::affinity::allowed_cpus().ok()?.first().copied()?;
    (first != server_cpu()).then_some(first)
}

/// The command that starts this program's echo server `server` on `cpu`.
///
/// A corewise server runs its dispatcher on `cpu` and is confined there
/// as a whole, as the other servers pin themselves: its helper threads
/// (the blocking-handoff monitor, the budget watcher) otherwise ran on the
/// generator's CPU, and every server must be held to the same one CPU.
pub fn server_command(exe: &Path, server: &str, cpu: usize, conns: usize) -> Command {
    let mut c = Command::new(exe);
    if server.starts_with("corewise") {
        c.args(["threads", "--serve-tpc", &format!("{server}:{cpu}")]);
        pin_child(&mut c, cpu);
    } else {
        c.args(["echo", "--serve", &format!("{server}:{cpu}:{conns}")]);
    }
    c
}

/// Makes the process `cmd` starts run on `cpu` only (all its threads: they
/// inherit the affinity of the thread that execs).
pub fn pin_child(cmd: &mut Command, cpu: usize) {
    crate::affinity::confine_child(cmd, &[cpu]);
}

/// Runs the server `serve` starts in a child (it prints its port on its
/// first stdout line) and the generator in another.
pub fn measure(
    mut serve: Command,
    conns: usize,
    active: usize,
    rate: u64,
    in_flight: u64,
    millis: u64,
) -> Outcome {
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
    let mut steal = [None, None];
    let mut out = match line.trim().parse::<u16>() {
        Ok(port) => {
            let mut load = Command::new(&exe);
            load.args([
                "threads",
                "--load",
                &format!("{port}:{conns}:{active}:{rate}:{millis}:{in_flight}"),
            ])
            .stdin(Stdio::null());
            let load_cpu = load_cpu();
            if let Some(cpu) = load_cpu {
                pin_child(&mut load, cpu);
            }
            let (steal0, t0) = (crate::procstat::steal_ns(), Instant::now());
            let res = load.output();
            let (steal1, wall) = (crate::procstat::steal_ns(), t0.elapsed().as_nanos() as u64);
            steal = [Some(server_cpu()), load_cpu]
                .map(|c| c.and_then(|c| crate::procstat::steal_percent(&steal0, &steal1, c, wall)));
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
    [out.server_steal_pct, out.load_steal_pct] = steal;
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
