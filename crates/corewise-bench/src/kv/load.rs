//! The load engine: one thread, many non-blocking connections, one epoll
//! set, busy-polled (the generator owns its CPU).
//!
//! Open loop: arrivals form a Poisson process at the target rate; each
//! arrival goes to a random connection and is written as soon as it is
//! due, pipelined behind whatever that connection still waits for. Its
//! latency runs from the *scheduled* send time to the end of its reply, so
//! a server (or generator) that falls behind is charged for the whole
//! delay instead of silently sending less (no coordinated omission).
//! Closed loop: each connection keeps `depth` requests outstanding and
//! sends the next one when a reply completes; latency runs from the send.

use super::workload::{Op, Rng, Workload};
use crate::error::BenchError;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How requests are issued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Poisson arrivals at this many requests per second.
    Open(f64),
    /// This many outstanding requests per connection.
    Closed(usize),
}

/// One measurement's settings.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Server port on 127.0.0.1.
    pub port: u16,
    /// Connections.
    pub connections: usize,
    /// Open or closed loop.
    pub pace: Pace,
    /// Requests before this are not recorded.
    pub warmup: Duration,
    /// Recording time after the warmup.
    pub measure: Duration,
    /// RNG seed (same seed, same request sequence).
    pub seed: u64,
    /// Sleep in `epoll_wait` until the next arrival or reply instead of
    /// polling: for runs where the generator shares its CPU with other work
    /// (`--neighbour`), so that it leaves that CPU when it has nothing to do.
    pub blocking: bool,
}

/// One measurement's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Offered rate (open loop) or 0 (closed loop).
    pub offered_per_s: f64,
    /// Replies completed per second in the recording window.
    pub throughput_per_s: f64,
    /// Latency histogram in nanoseconds.
    pub hist: Histogram<u64>,
    /// Requests never answered before the drain deadline (counted in the
    /// histogram at the deadline, so they raise the tail).
    pub unanswered: u64,
    /// get replies that found no value.
    pub misses: u64,
}

impl Outcome {
    /// A latency quantile in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// One line (STORED, NOT_STORED, errors).
    Line,
    /// VALUE blocks until END.
    Get,
}

struct Conn {
    s: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inp: Vec<u8>,
    inp_pos: usize,
    /// (scheduled or send time in ns, reply kind).
    waiting: VecDeque<(u64, Reply)>,
    /// Inside a get reply: a value was seen.
    got_value: bool,
}

impl Conn {
    fn connect(port: u16) -> Result<Conn, BenchError> {
        let s = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| BenchError::io(format!("connecting to 127.0.0.1:{port}"), e))?;
        s.set_nodelay(true)
            .map_err(|e| BenchError::io("nodelay", e))?;
        s.set_nonblocking(true)
            .map_err(|e| BenchError::io("nonblocking", e))?;
        Ok(Conn {
            s,
            out: Vec::with_capacity(4096),
            out_pos: 0,
            inp: vec![0; 256 * 1024],
            inp_pos: 0,
            waiting: VecDeque::new(),
            got_value: false,
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            match self.s.write(&self.out[self.out_pos..]) {
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(())
    }

    /// Reads and parses; calls `done(start_ns, missed)` per completed reply.
    fn read(&mut self, mut done: impl FnMut(u64, bool)) -> io::Result<bool> {
        loop {
            if self.inp_pos == self.inp.len() {
                let n = self.inp.len() * 2;
                self.inp.resize(n, 0);
            }
            let room = self.inp.len() - self.inp_pos;
            match self.s.read(&mut self.inp[self.inp_pos..]) {
                Ok(0) => return Ok(false),
                Ok(n) if n < room => {
                    // A short read emptied the socket: more data is a new
                    // edge, so no second read to see EAGAIN (a system call
                    // per event saved; on a host where they are dear, the
                    // generator's own ceiling).
                    self.inp_pos += n;
                    break;
                }
                Ok(n) => self.inp_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut at = 0;
        loop {
            let buf = &self.inp[at..self.inp_pos];
            let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                break;
            };
            let line = &buf[..nl];
            let Some(&(start, kind)) = self.waiting.front() else {
                // A reply nobody waits for: skip it.
                at += nl + 1;
                continue;
            };
            if kind == Reply::Get && line.starts_with(b"VALUE ") {
                let len: usize = std::str::from_utf8(line)
                    .ok()
                    .and_then(|l| l.trim_end().split(' ').nth(3))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                if buf.len() < nl + 1 + len + 2 {
                    break;
                }
                at += nl + 1 + len + 2;
                self.got_value = true;
                continue;
            }
            at += nl + 1;
            self.waiting.pop_front();
            let missed = kind == Reply::Get && !self.got_value;
            self.got_value = false;
            done(start, missed);
        }
        self.inp.copy_within(at..self.inp_pos, 0);
        self.inp_pos -= at;
        Ok(true)
    }
}

struct Epoll(std::os::fd::OwnedFd);

const TIMER_TOKEN: u64 = u64::MAX;
/// In blocking mode, gaps shorter than this are polled, not slept.
const BLOCK_MIN_NS: u64 = 20_000;
/// In blocking mode, how much earlier than the next event the sleep ends.
const WAKE_EARLY_NS: u64 = 5_000;

/// A one-shot monotonic timer whose expiry is an epoll event.
struct Timer(std::os::fd::OwnedFd);

impl Timer {
    fn new(ep: &Epoll) -> Result<Self, BenchError> {
        // SAFETY: plain system call.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(BenchError::io("timerfd_create", io::Error::last_os_error()));
        }
        // SAFETY: a new fd that nobody else owns.
        let t = Timer(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
        ep.add(t.0.as_raw_fd(), TIMER_TOKEN)?;
        Ok(t)
    }

    /// Fires once, `ns` from now (re-arming also clears an expiry not yet
    /// seen, so the edge-triggered event comes again).
    fn arm(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000).max(1) as libc::c_long,
            },
        };
        // SAFETY: valid pointers for the call; a null old value is allowed.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }
}

impl Epoll {
    fn new() -> Result<Self, BenchError> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(BenchError::io("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: a new fd that nobody else owns.
        Ok(Epoll(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }))
    }

    fn add(&self, fd: i32, token: u64) -> Result<(), BenchError> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: valid event pointer for the call.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(BenchError::io("epoll_ctl", io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Waits up to `timeout_ns` for events (sub-millisecond: the timeout is
    /// a timerfd in the set, re-armed on every call).
    fn wait(&self, timer: &Timer, evs: &mut [libc::epoll_event], timeout_ns: u64) -> usize {
        let n = if timeout_ns == 0 {
            self.poll(evs)
        } else {
            timer.arm(timeout_ns);
            // SAFETY: `evs` is valid for writes of its length.
            let n = unsafe {
                libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, -1)
            };
            n.max(0) as usize
        };
        // The timer's own event carries no work.
        let mut k = 0;
        for i in 0..n {
            if evs[i].u64 != TIMER_TOKEN {
                evs[k] = evs[i];
                k += 1;
            }
        }
        k
    }

    fn poll(&self, evs: &mut [libc::epoll_event]) -> usize {
        // SAFETY: `evs` is valid for writes of its length.
        let n =
            unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0) };
        n.max(0) as usize
    }
}

/// Stores every key once (pipelined, closed loop), so gets hit.
pub fn preload(port: u16, w: &Workload, fill: &[u8]) -> Result<(), BenchError> {
    let mut c = Conn::connect(port)?;
    c.s.set_nonblocking(false)
        .map_err(|e| BenchError::io("blocking", e))?;
    let mut r = std::io::BufReader::new(c.s.try_clone().map_err(|e| BenchError::io("clone", e))?);
    let batch = 100;
    let mut id = 0u32;
    while (id as usize) < w.len() {
        let mut out = Vec::new();
        let end = (id as usize + batch).min(w.len()) as u32;
        for k in id..end {
            w.encode(Op::Set(k), fill, &mut out);
        }
        c.s.write_all(&out)
            .map_err(|e| BenchError::io("preload write", e))?;
        for _ in id..end {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut r, &mut line)
                .map_err(|e| BenchError::io("preload read", e))?;
            if !line.starts_with("STORED") {
                return Err(BenchError::Machine(format!(
                    "preload: server replied {line:?}"
                )));
            }
        }
        id = end;
    }
    Ok(())
}

/// Runs one measurement.
pub fn run(plan: &Plan, w: &Workload, fill: &[u8]) -> Result<Outcome, BenchError> {
    let ep = Epoll::new()?;
    let timer = Timer::new(&ep)?;
    let mut conns = Vec::with_capacity(plan.connections);
    for i in 0..plan.connections.max(1) {
        let c = Conn::connect(plan.port)?;
        ep.add(c.s.as_raw_fd(), i as u64)?;
        conns.push(c);
    }
    let mut hist = Histogram::<u64>::new_with_bounds(100, 120_000_000_000, 3)
        .map_err(|e| BenchError::Machine(format!("histogram: {e}")))?;
    let mut rng = Rng::new(plan.seed);
    let t0 = Instant::now();
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    let warm = plan.warmup.as_nanos() as u64;
    let end = warm + plan.measure.as_nanos() as u64;
    let drain_end = end + 2_000_000_000;
    let mut completed = 0u64;
    let mut misses = 0u64;
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 512];
    let mut dirty: Vec<usize> = Vec::new();
    let n = conns.len();

    let issue = |c: &mut Conn, t: u64, rng: &mut Rng| {
        let op = w.next(rng);
        w.encode(op, fill, &mut c.out);
        c.waiting.push_back((
            t,
            match op {
                Op::Get(_) => Reply::Get,
                Op::Set(_) => Reply::Line,
            },
        ));
    };

    let (mean_gap, depth) = match plan.pace {
        Pace::Open(rate) => (1e9 / rate.max(1.0), 0),
        Pace::Closed(d) => (0.0, d.max(1)),
    };
    let mut next_arrival = 0.0f64;
    if depth > 0 {
        for (i, c) in conns.iter_mut().enumerate() {
            for _ in 0..depth {
                issue(c, 0, &mut rng);
            }
            dirty.push(i);
        }
    }
    let mut now;
    loop {
        now = ns(Instant::now());
        let outstanding = conns.iter().any(|c| !c.waiting.is_empty());
        if now >= end && (!outstanding || depth > 0 || now >= drain_end) {
            break;
        }
        if depth == 0 && now < end {
            while next_arrival <= now as f64 {
                let i = rng.below(n as u64) as usize;
                issue(&mut conns[i], next_arrival as u64, &mut rng);
                dirty.push(i);
                next_arrival += rng.exp(mean_gap);
            }
        }
        for i in dirty.drain(..) {
            conns[i]
                .flush()
                .map_err(|e| BenchError::io("sending requests", e))?;
        }
        for c in conns.iter_mut() {
            if c.out_pos < c.out.len() {
                c.flush()
                    .map_err(|e| BenchError::io("sending requests", e))?;
            }
        }
        let k = if plan.blocking {
            let pending_out = conns.iter().any(|c| c.out_pos < c.out.len());
            let until = if pending_out {
                now
            } else if depth == 0 && now < end {
                (next_arrival as u64).min(end)
            } else if now < end {
                end
            } else {
                drain_end
            };
            // Sleeping costs a timer and a wake-up: only for gaps that are
            // worth it, waking a little early and polling the rest.
            let gap = until.saturating_sub(now);
            ep.wait(
                &timer,
                &mut evs,
                if gap < BLOCK_MIN_NS {
                    0
                } else {
                    gap - WAKE_EARLY_NS
                },
            )
        } else {
            ep.poll(&mut evs)
        };
        if k == 0 {
            continue;
        }
        let t = ns(Instant::now());
        for ev in &evs[..k] {
            let i = ev.u64 as usize;
            let mut finished = 0usize;
            let open = conns[i]
                .read(|start, missed| {
                    if start >= warm && start < end {
                        let _ = hist.record(t.saturating_sub(start).max(100));
                    }
                    if t >= warm && t <= end {
                        completed += 1;
                    }
                    if missed {
                        misses += 1;
                    }
                    finished += 1;
                })
                .map_err(|e| BenchError::io("reading replies", e))?;
            if !open {
                return Err(BenchError::Machine("the server closed a connection".into()));
            }
            if depth > 0 && t < end {
                for _ in 0..finished {
                    issue(&mut conns[i], t, &mut rng);
                }
                if finished > 0 {
                    dirty.push(i);
                }
            }
        }
    }
    // Whatever is still unanswered counts at the deadline.
    let mut unanswered = 0;
    for c in &conns {
        for &(start, _) in &c.waiting {
            if start >= warm && start < end {
                let _ = hist.record(now.saturating_sub(start).max(100));
                unanswered += 1;
            }
        }
    }
    let secs = plan.measure.as_secs_f64();
    Ok(Outcome {
        offered_per_s: match plan.pace {
            Pace::Open(r) => r,
            Pace::Closed(_) => 0.0,
        },
        throughput_per_s: completed as f64 / secs,
        hist,
        unanswered,
        misses,
    })
}
