//! `corewise-bench echo`: a 64-byte echo over 1 to 1000 TCP connections on
//! 127.0.0.1, four servers, one load generator, one table.
//!
//! Servers: `corewise-uring` and `corewise-epoll` (corewise's blocking
//! sockets on each back end, see [`servers::corewise`]), `tokio` (current-
//! thread runtime, a task per connection) and `epoll-loop` (a plain
//! level-triggered event loop). Each server runs in a child process of this
//! program, pinned to one CPU (the last allowed one); the load generator is
//! an OS thread of this process pinned to another CPU (the first), so on a
//! 2-CPU machine each side has a CPU of its own.
//!
//! System calls per request: `perf stat -e raw_syscalls:sys_enter -p PID`
//! counts every system call the server process makes during the
//! measurement window (all its threads, the io_uring SQPOLL thread
//! excluded, none is used here); the count is divided by the round trips the
//! load generator completed in the same window. Where `perf` is missing the
//! column reads `n/a`.
//!
//! Output: a markdown table on stdout (and `--md PATH`), `--json PATH` with
//! one record per server and connection count. `bench/echo.sh` runs it and
//! draws `echo.png` with `bench/echo_plot.py`.

pub(crate) mod load;
mod servers;

use crate::error::BenchError;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Command line of `corewise-bench echo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the markdown table here too.
    #[arg(long)]
    pub md: Option<PathBuf>,
    /// Shorter windows (the whole run stays under two minutes).
    #[arg(long)]
    pub quick: bool,
    /// Connection counts (default 1,16,64,256,1000).
    #[arg(long, value_delimiter = ',')]
    pub connections: Option<Vec<usize>>,
    /// Servers to run (default all four).
    #[arg(long, value_delimiter = ',')]
    pub servers: Option<Vec<String>>,
    /// Internal: run one server (`KIND:CPU:CONNS`) and print its port.
    #[arg(long, hide = true)]
    pub serve: Option<String>,
}

/// One row of the results.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// corewise-uring, corewise-epoll, tokio or epoll-loop.
    pub server: String,
    /// Concurrent connections.
    pub connections: usize,
    /// Round trips per second.
    pub throughput_per_s: f64,
    /// Median round trip, µs.
    pub p50_us: f64,
    /// 99th percentile round trip, µs.
    pub p99_us: f64,
    /// Server system calls per round trip (`None`: not measured).
    pub syscalls_per_request: Option<f64>,
}

const SERVERS: [&str; 4] = ["corewise-uring", "corewise-epoll", "tokio", "epoll-loop"];

/// Runs the benchmark (or, with `--serve`, one server).
pub fn run(args: &Args) -> Result<(), BenchError> {
    if let Some(spec) = &args.serve {
        serve(spec);
    }
    let cpus = crate::affinity::allowed_cpus()?;
    let (load_cpu, server_cpu) = (cpus[0], *cpus.last().unwrap_or(&cpus[0]));
    let counts = args
        .connections
        .clone()
        .unwrap_or_else(|| vec![1, 16, 64, 256, 1000]);
    let servers: Vec<String> = args
        .servers
        .clone()
        .unwrap_or_else(|| SERVERS.iter().map(|s| s.to_string()).collect());
    let (warmup, window) = if args.quick {
        (Duration::from_millis(200), Duration::from_millis(600))
    } else {
        (Duration::from_millis(500), Duration::from_secs(2))
    };
    crate::affinity::pin_current(load_cpu)?;
    raise_nofile(4096);
    let mut records = Vec::new();
    for &conns in &counts {
        for server in &servers {
            let r = measure(server, server_cpu, conns, warmup, window)?;
            eprintln!(
                "echo: {:>15} {:>5} conns: {:>9.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs  syscalls/req {}",
                r.server,
                r.connections,
                r.throughput_per_s,
                r.p50_us,
                r.p99_us,
                r.syscalls_per_request
                    .map_or("n/a".to_string(), |s| format!("{s:.3}"))
            );
            records.push(r);
        }
    }
    let md = markdown(&records, load_cpu, server_cpu);
    println!("{md}");
    if let Some(p) = &args.md {
        std::fs::write(p, &md).map_err(|e| BenchError::io("write markdown", e))?;
    }
    if let Some(p) = &args.json {
        let s = serde_json::to_string_pretty(&records)
            .map_err(|e| BenchError::io("encode json", std::io::Error::other(e)))?;
        std::fs::write(p, s).map_err(|e| BenchError::io("write json", e))?;
    }
    Ok(())
}

fn raise_nofile(want: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    if cur.current.is_some_and(|c| c < want) {
        let soft = cur.maximum.map_or(want, |m| m.min(want));
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum: cur.maximum,
            },
        );
    }
}

/// Child side: start the server, print its port, serve until killed.
fn serve(spec: &str) -> ! {
    let mut it = spec.split(':');
    let kind = it.next().unwrap_or("");
    let cpu: usize = it.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let conns: usize = it.next().and_then(|c| c.parse().ok()).unwrap_or(1);
    raise_nofile(4096);
    // The whole process on one CPU: the server and any helper thread.
    let _ = crate::affinity::pin_current(cpu);
    let port = |p: u16| {
        println!("{p}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
    };
    match kind {
        "corewise-uring" => servers::corewise(cpu, corewise::IoBackend::Uring, port, conns),
        "corewise-epoll" => servers::corewise(cpu, corewise::IoBackend::Epoll, port, conns),
        "tokio" => servers::tokio(cpu, port),
        _ => servers::epoll_loop(cpu, port),
    }
}

fn measure(
    server: &str,
    cpu: usize,
    conns: usize,
    warmup: Duration,
    window: Duration,
) -> Result<Record, BenchError> {
    let exe = std::env::current_exe().map_err(|e| BenchError::io("current_exe", e))?;
    let mut child = Command::new(exe)
        .args(["echo", "--serve", &format!("{server}:{cpu}:{conns}")])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| BenchError::io("spawn server", e))?;
    let pid = child.id();
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| BenchError::io("read server port", e))?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| BenchError::Machine(format!("{server}: no port from server ({line:?})")))?;
    let result = (|| {
        let streams = load::connect(port, conns).map_err(|e| BenchError::io("connect", e))?;
        let mut perf = None;
        let w = load::drive(streams, warmup, window, || {
            perf = Command::new("perf")
                .args(["stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p"])
                .arg(pid.to_string())
                .args(["--", "sleep"])
                .arg(format!("{:.3}", window.as_secs_f64()))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .ok();
        })
        .map_err(|e| BenchError::io("load generator", e))?;
        let syscalls = perf.and_then(|p| {
            let out = p.wait_with_output().ok()?;
            let text = String::from_utf8_lossy(&out.stderr);
            let line = text
                .lines()
                .find(|l| l.contains("raw_syscalls:sys_enter"))?;
            line.split(',').next()?.trim().parse::<f64>().ok()
        });
        Ok::<_, BenchError>((w, syscalls))
    })();
    let _ = child.kill();
    let _ = child.wait();
    let (w, syscalls) = result?;
    let pct = |p: f64| -> f64 {
        if w.latencies_ns.is_empty() {
            return f64::NAN;
        }
        let i = ((w.latencies_ns.len() as f64 - 1.0) * p).round() as usize;
        w.latencies_ns[i] as f64 / 1000.0
    };
    let secs = w.elapsed.as_secs_f64();
    Ok(Record {
        server: server.to_string(),
        connections: conns,
        throughput_per_s: w.requests as f64 / secs,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        syscalls_per_request: syscalls
            .filter(|_| w.requests > 0)
            .map(|s| s / w.requests as f64),
    })
}

fn markdown(records: &[Record], load_cpu: usize, server_cpu: usize) -> String {
    let mut s = format!(
        "### echo: 64-byte messages, closed loop (server on CPU {server_cpu}, load generator on CPU {load_cpu})\n\n\
         | server | connections | throughput (req/s) | p50 (µs) | p99 (µs) | syscalls/request |\n\
         |---|---:|---:|---:|---:|---:|\n"
    );
    for r in records {
        s.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} |\n",
            r.server,
            r.connections,
            r.throughput_per_s,
            r.p50_us,
            r.p99_us,
            r.syscalls_per_request
                .map_or("n/a".to_string(), |v| format!("{v:.3}"))
        ));
    }
    s
}
