//! The load generator: one OS thread, pinned, driving every connection
//! closed-loop through one level-triggered epoll set: send a 64-byte
//! message, wait for its echo, record the round trip, send the next. Two
//! system calls per round trip (read, write) plus the shared epoll_wait, so
//! that on a 2-CPU machine the generator's CPU is not the first limit.

use super::servers::MSG;
use rustix::event::epoll;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What one measurement window saw.
#[derive(Debug, Clone)]
pub struct Window {
    /// Round trips completed in the window.
    pub requests: u64,
    /// Their latencies, ns, sorted.
    pub latencies_ns: Vec<u64>,
    /// Length of the window.
    pub elapsed: Duration,
}

struct Conn {
    s: TcpStream,
    got: usize,
    sent_at: Instant,
}

/// Opens `conns` connections to `port`.
pub fn connect(port: u16, conns: usize) -> std::io::Result<Vec<TcpStream>> {
    (0..conns)
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_nodelay(true)?;
            Ok(s)
        })
        .collect()
}

/// Makes `s` non-blocking and adds it to the level-triggered set `ep` for
/// reading, keyed by `key`.
pub fn watch(ep: &impl std::os::fd::AsFd, s: &TcpStream, key: usize) -> std::io::Result<()> {
    s.set_nonblocking(true)?;
    epoll::add(
        ep,
        s,
        epoll::EventData::new_u64(key as u64),
        epoll::EventFlags::IN,
    )?;
    Ok(())
}

/// Runs the closed loop for `warmup`, then measures for `window`, calling
/// `at_start` when the window opens (to start the system-call count).
pub fn drive(
    streams: Vec<TcpStream>,
    warmup: Duration,
    window: Duration,
    at_start: impl FnOnce(),
) -> std::io::Result<Window> {
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    let msg = [7u8; MSG];
    let mut conns: Vec<Conn> = Vec::with_capacity(streams.len());
    for (i, s) in streams.into_iter().enumerate() {
        watch(&ep, &s, i)?;
        conns.push(Conn {
            s,
            got: 0,
            sent_at: Instant::now(),
        });
    }
    for c in conns.iter_mut() {
        c.sent_at = Instant::now();
        (&c.s).write_all(&msg)?;
    }
    let mut events = Vec::with_capacity(1024);
    let mut buf = [0u8; MSG];
    let start = Instant::now();
    let mut at_start = Some(at_start);
    let mut measuring = false;
    let mut open = start;
    let mut lat = Vec::with_capacity(1 << 20);
    loop {
        let now = Instant::now();
        if !measuring && now >= start + warmup {
            measuring = true;
            open = now;
            if let Some(f) = at_start.take() {
                f();
            }
        }
        if measuring && now >= open + window {
            break;
        }
        events.clear();
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), Some(&ts))?;
        for ev in events.iter() {
            let ev = *ev;
            let c = &mut conns[ev.data.u64() as usize];
            loop {
                match (&c.s).read(&mut buf[..MSG - c.got]) {
                    Ok(0) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("server closed connection {}", c.s.as_raw_fd()),
                        ))
                    }
                    Ok(n) => {
                        c.got += n;
                        if c.got == MSG {
                            c.got = 0;
                            let t = Instant::now();
                            if measuring {
                                lat.push((t - c.sent_at).as_nanos() as u64);
                            }
                            c.sent_at = t;
                            (&c.s).write_all(&msg)?;
                            // The echo is complete and the next message is
                            // out: nothing more can arrive on this connection
                            // before the server answers again, and the set is
                            // level-triggered, so the read that would only
                            // say EAGAIN is skipped (a third of the
                            // generator's system calls).
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }
    let elapsed = open.elapsed();
    lat.sort_unstable();
    Ok(Window {
        requests: lat.len() as u64,
        latencies_ns: lat,
        elapsed,
    })
}
