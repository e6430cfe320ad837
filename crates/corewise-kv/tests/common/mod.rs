//! Starts the real `corewise-kv` binary on a free port and talks to it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server; killed on drop.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
}

/// A port free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// Descriptors the tests need at most: 10 000 client sockets, and the
/// server (a child, it inherits the limit) as many again.
const FDS_NEEDED: libc::rlim_t = 32_768;

/// Raises this test process's descriptor limit once: the soft limit to
/// [`FDS_NEEDED`] (a fresh Debian login's is 1 024), the hard limit too
/// when it is lower and the process may (root); Go's runtime raises its
/// soft limit the same way at start.
fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write only `rl`.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 || rl.rlim_cur >= FDS_NEEDED {
                return;
            }
            let raised = libc::rlimit {
                rlim_cur: FDS_NEEDED,
                rlim_max: rl.rlim_max.max(FDS_NEEDED),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                // Not allowed past the hard limit: as far as it goes.
                rl.rlim_cur = rl.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            }
        }
    });
}

/// The pid in the `stats` of the server at the other end of `c`.
fn server_pid(mut c: TcpStream, binary: bool) -> Option<u32> {
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    if binary {
        return binary_server_pid(c);
    }
    c.write_all(b"stats\r\n").ok()?;
    let mut lines = BufReader::new(c).lines();
    while let Some(Ok(line)) = lines.next() {
        if let Some(pid) = line.strip_prefix("STAT pid ") {
            return pid.trim().parse().ok();
        }
        if line == "END" {
            break;
        }
    }
    None
}

/// [`server_pid`] for a server that speaks only the binary protocol
/// (`-B binary`): a STAT request, one response per statistic (key, value),
/// the last with an empty key.
fn binary_server_pid(mut c: TcpStream) -> Option<u32> {
    c.write_all(&frame(0x10, &[], &[], &[], 0)).ok()?;
    let mut pid = None;
    loop {
        let mut h = [0u8; 24];
        c.read_exact(&mut h).ok()?;
        let key = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let mut b = vec![0; body];
        c.read_exact(&mut b).ok()?;
        let extras = usize::from(h[4]);
        let (k, v) = b.get(extras..)?.split_at_checked(key)?;
        if k.is_empty() {
            return pid;
        }
        if k == b"pid" {
            pid = std::str::from_utf8(v).ok()?.parse().ok();
        }
    }
}

/// Whether `flags` make a server speak only the binary protocol.
fn binary_only(flags: &[&str]) -> bool {
    flags.windows(2).any(|w| w == ["-B", "binary"])
}

/// Starts `command(port)` on a free port and waits until it accepts;
/// `None` when the command cannot be run at all. Another test may be handed
/// the same free port and start its server there first (ours then fails to
/// bind and exits, or the probe reaches theirs): only a server whose `stats`
/// report our child's pid is ours, otherwise the next free port is tried.
fn spawn_on_free_port(
    command: impl Fn(u16) -> Command,
    what: &str,
    binary: bool,
) -> Option<(Child, u16)> {
    for _ in 0..5 {
        let port = free_port();
        let mut child = command(port).spawn().ok()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if let Ok(probe) = TcpStream::connect(("127.0.0.1", port)) {
                if server_pid(probe, binary) == Some(child.id()) {
                    return Some((child, port));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("{what} did not start on any of five free ports");
}

impl Server {
    /// Starts the server with these extra flags and waits until it accepts.
    pub fn start(extra: &[&str]) -> Server {
        raise_fd_limit();
        let (child, port) = spawn_on_free_port(
            |port| {
                let mut c = Command::new(env!("CARGO_BIN_EXE_corewise-kv"));
                c.args(["-p", &port.to_string(), "-l", "127.0.0.1"])
                    .args(extra)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                c
            },
            "corewise-kv",
            binary_only(extra),
        )
        .expect("cannot start corewise-kv");
        Server { child, port }
    }

    /// A new client.
    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident memory (`VmRSS`), in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("server status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal text-protocol client.
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    /// Connects to 127.0.0.1:`port`.
    pub fn connect(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    /// The socket.
    pub fn stream(&self) -> &TcpStream {
        &self.w
    }

    /// Sends raw bytes.
    pub fn send(&mut self, b: &[u8]) {
        self.w.write_all(b).expect("send");
    }

    /// Reads one line (without CRLF); empty string at end of stream.
    pub fn line(&mut self) -> String {
        let mut v = Vec::new();
        self.r.read_until(b'\n', &mut v).expect("read line");
        String::from_utf8_lossy(&v)
            .trim_end_matches(['\r', '\n'])
            .to_string()
    }

    /// Reads exactly `n` bytes plus CRLF.
    pub fn block(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n + 2];
        self.r.read_exact(&mut v).expect("read block");
        assert_eq!(&v[n..], b"\r\n");
        v.truncate(n);
        v
    }

    /// Sends a command line and reads the one-line reply.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n").as_bytes());
        self.line()
    }

    /// A storage command with its data block; the reply line.
    pub fn store(&mut self, head: &str, data: &[u8]) -> String {
        let mut b = format!("{head}\r\n").into_bytes();
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
        self.send(&b);
        self.line()
    }

    /// `set key 0 0 <len>`.
    pub fn set(&mut self, key: &str, data: &[u8]) -> String {
        self.store(&format!("set {key} 0 0 {}", data.len()), data)
    }

    /// A retrieval: the VALUE lines (header, data) until END.
    pub fn get_all(&mut self, line: &str) -> Vec<(String, Vec<u8>)> {
        self.send(format!("{line}\r\n").as_bytes());
        let mut out = Vec::new();
        loop {
            let l = self.line();
            if l == "END" {
                return out;
            }
            assert!(l.starts_with("VALUE "), "unexpected {l:?}");
            let n: usize = l.split(' ').nth(3).unwrap().parse().unwrap();
            let data = self.block(n);
            out.push((l, data));
        }
    }

    /// The value of `key`, if any.
    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.get_all(&format!("get {key}")).pop().map(|(_, d)| d)
    }

    /// `stats [group]` as (name, value) pairs.
    pub fn stats(&mut self, group: &str) -> Vec<(String, String)> {
        self.send(format!("stats {group}\r\n").as_bytes());
        let mut out = Vec::new();
        loop {
            let l = self.line();
            if l == "END" {
                return out;
            }
            let mut p = l.splitn(3, ' ');
            assert_eq!(p.next(), Some("STAT"), "unexpected {l:?}");
            out.push((
                p.next().unwrap().to_string(),
                p.next().unwrap_or("").to_string(),
            ));
        }
    }

    /// One general stat as a number.
    pub fn stat(&mut self, name: &str) -> u64 {
        self.stats("")
            .into_iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no stat {name}"))
    }
}

/// A binary-protocol request: opcode, extras, key, value, opaque (CAS 0).
pub fn frame(op: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut v = vec![0x80, op];
    v.extend_from_slice(&(key.len() as u16).to_be_bytes());
    v.push(extras.len() as u8);
    v.extend_from_slice(&[0, 0, 0]);
    v.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&[0; 8]);
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

/// Sends `req` then `mn` (meta no-op) and returns everything before the
/// `MN` reply: the replies to `req`, in order.
pub fn exchange(port: u16, req: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req).unwrap();
    s.write_all(b"mn\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while !got.ends_with(b"MN\r\n") {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got.truncate(got.len() - 4);
    got
}

/// Real memcached on a free port, when installed; killed on drop.
pub struct Memcached(Child, pub u16);

impl Memcached {
    /// Starts it, if `memcached` is on PATH.
    pub fn start() -> Option<Memcached> {
        Self::start_with(&[])
    }

    /// Starts it with these extra flags, if `memcached` is on PATH.
    pub fn start_with(extra: &[&str]) -> Option<Memcached> {
        let (child, port) = spawn_on_free_port(
            |port| {
                let mut c = Command::new("memcached");
                c.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
                    .args(["-u", "root"])
                    .args(extra)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                c
            },
            "memcached",
            binary_only(extra),
        )?;
        Some(Memcached(child, port))
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `req` against `s` (and memcached, when running) and checks that
/// each reply, passed through `norm`, is `want`.
pub fn check_both(
    s: &Server,
    mc: &Option<Memcached>,
    req: &[u8],
    want: &str,
    norm: impl Fn(&[u8]) -> String,
) {
    let shown = String::from_utf8_lossy(&req[..req.len().min(200)]);
    assert_eq!(
        norm(&exchange(s.port, req)),
        want,
        "corewise-kv on {shown:?}"
    );
    if let Some(m) = mc {
        assert_eq!(norm(&exchange(m.1, req)), want, "memcached on {shown:?}");
    }
}

/// corewise-kv and, when installed, memcached, both on free ports.
pub struct Pair {
    /// corewise-kv.
    pub server: Server,
    /// memcached, if it could be started.
    pub memcached: Option<Memcached>,
}

impl Pair {
    /// Starts corewise-kv with `flags` and memcached with its defaults.
    pub fn start(flags: &[&str]) -> Pair {
        Pair {
            server: Server::start(flags),
            memcached: Memcached::start(),
        }
    }

    /// Starts corewise-kv and memcached, both with `flags` (memcached's).
    pub fn start_alike(flags: &[&str]) -> Pair {
        Pair {
            server: Server::start(flags),
            memcached: Memcached::start_with(flags),
        }
    }

    /// The ports: corewise-kv's, then memcached's when it runs.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = vec![self.server.port];
        ports.extend(self.memcached.as_ref().map(|m| m.1));
        ports
    }

    /// [`check_both`] on this pair.
    pub fn check(&self, req: &[u8], want: &str, norm: impl Fn(&[u8]) -> String) {
        check_both(&self.server, &self.memcached, req, want, norm);
    }
}

/// Sends binary `frames` then a noop; returns (opcode, status, opaque,
/// value) of every response before the noop's.
pub fn bin_exchange(port: u16, frames: &[Vec<u8>]) -> Vec<(u8, u16, u32, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for f in frames {
        s.write_all(f).unwrap();
    }
    s.write_all(&frame(0x0a, &[], &[], &[], u32::MAX)).unwrap();
    let mut out = Vec::new();
    loop {
        let mut h = [0u8; 24];
        s.read_exact(&mut h).expect("response header");
        let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let mut b = vec![0; body];
        s.read_exact(&mut b).expect("response body");
        let skip = usize::from(h[4]) + usize::from(u16::from_be_bytes([h[2], h[3]]));
        let opaque = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        if h[1] == 0x0a && opaque == u32::MAX {
            return out;
        }
        b.truncate(skip + 16);
        out.push((
            h[1],
            u16::from_be_bytes([h[6], h[7]]),
            opaque,
            b[skip..].to_vec(),
        ));
    }
}
