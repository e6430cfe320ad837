//! 10 000 concurrent connections on 2 cores, for each back end: every
//! connection open at once, one round trip on each, driven by batches.
//!
//! The client ends live in a child process (this test binary re-run as
//! `client_child`), so the server's 10 000 descriptors fit under the
//! default `RLIMIT_NOFILE` of 20 000 with room to spare. The child connects
//! in waves of 1000 and waits (on its stdin) until the server has accepted
//! them, so the listen queue never overflows.

use corewise::io::{Batch, Completion, IoBackend};
use corewise::net::{TcpListener, TcpStream};
use std::io::{Read, Write};
use std::process::Command;

const CONNS: usize = 10_000;
const PER_THREAD: usize = 500;
const WAVE: usize = 1000;
const ENV: &str = "COREWISE_IO_MANY_ADDR";

/// One back end at a time: both at once would need twice the descriptors.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn raise_fd_limit(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    if cur.current.is_none_or(|c| c >= want) {
        return want;
    }
    let soft = cur.maximum.map_or(want, |m| m.min(want));
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: cur.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The client side, run in a child process: connect everything, send a
/// distinct number on each connection, check every echo.
#[test]
fn client_child() {
    let Ok(addr) = std::env::var(ENV) else { return };
    assert!(raise_fd_limit(CONNS as u64 + 500) >= CONNS as u64 + 500);
    let mut progress = std::io::BufReader::new(std::io::stdin());
    let mut accepted = 0usize;
    let mut conns: Vec<std::net::TcpStream> = Vec::with_capacity(CONNS);
    while conns.len() < CONNS {
        for _ in 0..WAVE {
            conns.push(std::net::TcpStream::connect(&addr).unwrap());
        }
        // The server accepts in batches of 64: it may be one batch short.
        while accepted + 64 < conns.len() {
            let mut line = String::new();
            use std::io::BufRead;
            assert!(
                progress.read_line(&mut line).unwrap() > 0,
                "server went away"
            );
            accepted = line.trim().parse().unwrap();
        }
    }
    for (i, c) in conns.iter_mut().enumerate() {
        c.write_all(&(i as u64).to_le_bytes()).unwrap();
    }
    for (i, c) in conns.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        c.read_exact(&mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i as u64);
    }
}

/// How the server side serves its connections.
#[derive(Clone, Copy, PartialEq)]
enum Serve {
    /// Groups of 500 connections, one user thread and one batch each.
    Batches,
    /// One user thread per connection, blocked in `read`, all on one core:
    /// far more threads than the core's 56 slots.
    ThreadPerConnection,
}

fn many(b: IoBackend, serve: Serve) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    assert!(raise_fd_limit(CONNS as u64 + 500) >= CONNS as u64 + 500);
    let cpus: &[usize] = match serve {
        Serve::Batches => &[0, 1],
        Serve::ThreadPerConnection => &[0],
    };
    let rt = corewise::Runtime::builder()
        .cpus(cpus.iter().copied())
        .io_backend(b)
        .build()
        .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "client_child", "--test-threads=1", "--quiet"])
        .env(ENV, addr.to_string())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = child.stdin.take().unwrap();
    let served = rt
        .block_on(move || {
            // Accept everything, 64 accepts in flight at once.
            let mut servers: Vec<TcpStream> = Vec::with_capacity(CONNS);
            while servers.len() < CONNS {
                let mut batch = Batch::new();
                for _ in 0..(CONNS - servers.len()).min(64) {
                    batch.accept(&l);
                }
                for (_, c) in batch.wait_all() {
                    match c {
                        Completion::Accepted(Ok((s, _))) => servers.push(s),
                        Completion::Accepted(Err(e)) => panic!("accept: {e}"),
                        _ => unreachable!(),
                    }
                }
                writeln!(progress, "{}", servers.len()).unwrap();
            }
            if serve == Serve::ThreadPerConnection {
                // Every thread blocks in `read` until the client, which
                // writes only once all are connected, sends its number.
                let hs: Vec<_> = servers
                    .into_iter()
                    .map(|mut s| {
                        corewise::spawn(move || {
                            let mut b = [0u8; 8];
                            s.read_exact(&mut b).and_then(|()| s.write_all(&b)).is_ok()
                        })
                        .unwrap()
                    })
                    .collect();
                return hs
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .filter(|&ok| ok)
                    .count();
            }
            // Echo one message on every connection: groups of 500, each
            // group one user thread with one read batch and one write batch.
            let mut groups: Vec<Vec<TcpStream>> = Vec::new();
            let mut it = servers.into_iter();
            for _ in 0..CONNS / PER_THREAD {
                groups.push(it.by_ref().take(PER_THREAD).collect());
            }
            let echoers: Vec<_> = groups
                .into_iter()
                .map(|group| {
                    corewise::spawn(move || {
                        let mut reads = Batch::new();
                        for s in &group {
                            reads.read(s, 8);
                        }
                        let got = reads.wait_all();
                        drop(reads);
                        let mut writes = Batch::new();
                        for ((_, c), s) in got.into_iter().zip(&group) {
                            let Completion::Read(Ok(8), buf) = c else {
                                panic!("server read failed")
                            };
                            writes.write(s, buf);
                        }
                        let n = writes
                            .wait_all()
                            .into_iter()
                            .filter(|(_, c)| matches!(c, Completion::Written(Ok(8), _)))
                            .count();
                        drop(writes);
                        (n, group)
                    })
                    .unwrap()
                })
                .collect();
            let done: Vec<_> = echoers.into_iter().map(|h| h.join().unwrap()).collect();
            done.iter().map(|(n, _)| n).sum::<usize>()
        })
        .unwrap();
    assert_eq!(served, CONNS);
    assert!(
        child.wait().unwrap().success(),
        "the client process saw a wrong echo"
    );
}

#[test]
fn ten_thousand_connections_uring() {
    many(IoBackend::Uring, Serve::Batches);
}

#[test]
fn ten_thousand_connections_epoll() {
    many(IoBackend::Epoll, Serve::Batches);
}

#[test]
fn ten_thousand_threads_blocked_in_read_on_one_core_uring() {
    many(IoBackend::Uring, Serve::ThreadPerConnection);
}

#[test]
fn ten_thousand_threads_blocked_in_read_on_one_core_epoll() {
    many(IoBackend::Epoll, Serve::ThreadPerConnection);
}
