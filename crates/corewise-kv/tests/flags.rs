//! memcached's `-F`, `-X`, `-W`, `-R` and `-b` against the real binary,
//! side by side with memcached (given the same flags) when it is
//! installed: the refusals' exact bytes, what is still counted, the
//! `stats settings` lines, the yields `-R` makes, and the listening
//! socket's backlog as the kernel shows it.

mod common;

use common::{bin_exchange, frame, Client, Pair, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

fn raw(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

/// Sends `req` in one write on a new connection and reads until the
/// replies end with `end`.
fn send_in_one_write(port: u16, req: &[u8], end: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req).unwrap();
    read_until(&mut s, end)
}

/// Reads from `s` until what came ends with `end`.
fn read_until(s: &mut impl Read, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    while !got.ends_with(end) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", raw(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// The value of `name` in `stats settings` on `port`.
fn setting(port: u16, name: &str) -> String {
    let mut c = Client::connect(port);
    c.stats("settings")
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no setting {name}"))
}

#[test]
fn commands_turned_off_are_refused_as_memcached_refuses_them() {
    let both = Pair::start_alike(&["-F", "-X", "-W"]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    let ports = both.ports();

    check("set a 0 0 1\r\nx\r\n", "STORED\r\n");
    // Refused whatever the delay, a bad one included; `noreply` silences
    // the refusal.
    check(
        "flush_all\r\nflush_all 10\r\nflush_all noreply\r\nflush_all bogus\r\n",
        "CLIENT_ERROR flush_all not allowed\r\n\
         CLIENT_ERROR flush_all not allowed\r\n\
         CLIENT_ERROR flush_all not allowed\r\n",
    );
    check("get a\r\n", "VALUE a 0 1\r\nx\r\nEND\r\n");
    check(
        "stats cachedump 1 1\r\nstats cachedump\r\n",
        "CLIENT_ERROR stats cachedump not allowed\r\n\
         CLIENT_ERROR stats cachedump not allowed\r\n",
    );
    check(
        "lru_crawler metadump all\r\nlru_crawler metadump hash\r\n",
        "ERROR metadump not allowed\r\nERROR metadump not allowed\r\n",
    );
    for port in &ports {
        // `watch` ends what a connection can send, so on its own.
        let got = send_in_one_write(*port, b"watch fetchers\r\n", b"\r\n");
        assert_eq!(raw(&got), "CLIENT_ERROR watch commands not allowed\r\n");
    }
    for port in &ports {
        // Binary flush and flushq: refused with an authentication error
        // (flushq too: errors are never quiet), the value still there.
        let replies = bin_exchange(
            *port,
            &[frame(0x08, &[], &[], &[], 7), frame(0x18, &[], &[], &[], 8)],
        );
        assert_eq!(
            replies,
            vec![
                (0x08, 0x20, 7, b"Auth failure.".to_vec()),
                (0x18, 0x20, 8, b"Auth failure.".to_vec()),
            ],
            "port {port}"
        );
        let mut c = Client::connect(*port);
        assert_eq!(c.get("a").as_deref(), Some(&b"x"[..]), "port {port}");
        // Each refused text flush is counted, as memcached counts it; the
        // binary ones are not (memcached counts those only when it runs
        // them).
        assert_eq!(c.stat("cmd_flush"), 4, "port {port}");
        assert_eq!(setting(*port, "flush_enabled"), "no");
        assert_eq!(setting(*port, "dump_enabled"), "no");
    }
}

#[test]
fn flushing_and_dumping_stay_on_by_default() {
    let both = Pair::start_alike(&[]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    // A bad delay is an error, silenced by `noreply` as memcached
    // silences every answer of a `noreply` command.
    check(
        "flush_all bogus\r\nflush_all bogus noreply\r\nflush_all\r\n",
        "CLIENT_ERROR invalid exptime argument\r\nOK\r\n",
    );
    check("stats cachedump 1 1\r\n", "END\r\n");
    assert_eq!(setting(both.server.port, "flush_enabled"), "yes");
    assert_eq!(setting(both.server.port, "dump_enabled"), "yes");
    assert_eq!(setting(both.server.port, "reqs_per_event"), "20");
    assert_eq!(setting(both.server.port, "tcp_backlog"), "1024");
}

/// Sends `n` gets and a `mn` in one write (one read on the server's side)
/// and waits for the `MN`; returns how much `conn_yields` grew.
fn yields_for(port: u16, n: usize) -> u64 {
    let before = Client::connect(port).stat("conn_yields");
    let mut req: Vec<u8> = (0..n)
        .flat_map(|i| format!("get k{i}\r\n").into_bytes())
        .collect();
    req.extend_from_slice(b"mn\r\n");
    let got = send_in_one_write(port, &req, b"MN\r\n");
    assert_eq!(got.len(), n * 5 + 4, "every get answered END");
    Client::connect(port).stat("conn_yields") - before
}

#[test]
fn a_connection_yields_after_its_requests_per_event() {
    let both = Pair::start_alike(&["-R", "5"]);
    for port in both.ports() {
        assert_eq!(setting(port, "reqs_per_event"), "5");
        // Requests in one read (the gets and the `mn`): a yield after
        // every fifth with more waiting, none after the last.
        for (requests, yields) in [(5, 0), (6, 1), (10, 1), (11, 2), (100, 19)] {
            assert_eq!(
                yields_for(port, requests - 1),
                yields,
                "{requests} requests in one read on port {port}"
            );
        }
        // `stats reset` zeroes the count.
        let mut c = Client::connect(port);
        assert_eq!(c.cmd("stats reset"), "RESET");
        assert_eq!(c.stat("conn_yields"), 0);
    }
}

#[test]
fn minus_r_zero_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
        .args(["-R", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        raw(&out.stderr).contains("requests per event must be greater than 0"),
        "{}",
        raw(&out.stderr)
    );
}

/// The backlog of the socket listening on `port`, as `ss` shows it (its
/// Send-Q column for a listening socket).
fn backlog(port: u16) -> u64 {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2; scripts/install-test-deps.sh installs it)");
    let text = raw(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"LISTEN"), "{text}");
    fields[2].parse().unwrap()
}

#[test]
fn the_listen_backlog_is_minus_b() {
    let somaxconn: u64 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let small = Server::start(&["-b", "37"]);
    assert_eq!(backlog(small.port), 37);
    assert_eq!(setting(small.port, "tcp_backlog"), "37");
    let default = Server::start(&[]);
    assert_eq!(backlog(default.port), 1024.min(somaxconn));
}

/// A server started with `args` that listens on the unix socket `path`
/// (`-s`), killed on drop.
struct UnixServer(std::process::Child);

impl UnixServer {
    /// Starts `program` with `args` and waits until `path` accepts.
    fn start(program: &str, args: &[&str], path: &std::path::Path) -> UnixServer {
        let mut child = Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(path).is_err() {
            assert!(child.try_wait().unwrap().is_none(), "{program} exited");
            assert!(
                std::time::Instant::now() < deadline,
                "{program} never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        UnixServer(child)
    }
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `req` on the unix socket `path` and reads until `end`.
fn over_unix(path: &std::path::Path, req: &[u8], end: &[u8]) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req).unwrap();
    raw(&read_until(&mut s, end))
}

/// The lines of `stats settings` and `stats conns` that `-s` and `-a`
/// change, with `path` written as PATH and descriptors as FD, each once
/// (a connection that has just closed may still be listed).
fn unix_lines(path: &std::path::Path) -> Vec<String> {
    let shown = path.display().to_string();
    let replies = over_unix(path, b"stats settings\r\n", b"END\r\n")
        + &over_unix(path, b"stats conns\r\n", b"END\r\n");
    replies
        .lines()
        .filter(|l| {
            ["domain_socket", "umask", ":addr", ":listen_addr"]
                .iter()
                .any(|k| l.contains(k))
        })
        .map(|l| {
            let l = l.replace(&shown, "PATH");
            match l.split_once(':') {
                // `STAT 23:addr ...`: the descriptor differs.
                Some((head, rest))
                    if head.starts_with("STAT ") && head[5..].parse::<u32>().is_ok() =>
                {
                    format!("STAT FD:{rest}")
                }
                _ => l,
            }
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[test]
fn a_unix_socket_replaces_the_network() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("kv-unix");
    let path = dir.0.join("kv.sock");
    // A socket file left by a server that was killed: taken over. (A
    // process that another test forks may hold the listener a moment, until
    // it execs: the file is stale once a connect is refused.)
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    while std::os::unix::net::UnixStream::connect(&path).is_ok() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let kv = UnixServer::start(
        env!("CARGO_BIN_EXE_corewise-kv"),
        &["-s", path.to_str().unwrap(), "-a", "766"],
        &path,
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o766);
    assert_eq!(
        over_unix(&path, b"set k 0 0 2\r\nhi\r\nget k\r\n", b"END\r\n"),
        "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n"
    );
    // No TCP socket: the network is off.
    let ss = Command::new("ss").args(["-Hltnp"]).output().unwrap();
    let pid = format!("pid={},", kv.0.id());
    assert!(!raw(&ss.stdout).contains(&pid), "{}", raw(&ss.stdout));
    let lines = unix_lines(&path);
    assert_eq!(
        lines,
        [
            "STAT FD:addr ?:<AF 0>",
            "STAT FD:addr unix:PATH",
            "STAT FD:listen_addr unix:PATH",
            "STAT domain_socket PATH",
            "STAT umask 766",
        ]
    );
    // memcached, given the same flags, shows the same.
    if Command::new("memcached").arg("-V").output().is_ok() {
        let mc_path = dir.0.join("mc.sock");
        let _mc = UnixServer::start(
            "memcached",
            &["-u", "root", "-s", mc_path.to_str().unwrap(), "-a", "766"],
            &mc_path,
        );
        assert_eq!(unix_lines(&mc_path), lines);
    }
    drop(kv);
    // A file that is not a socket is in the way: a clear error, and the
    // file is left as it was.
    let file = dir.0.join("not-a-socket");
    std::fs::write(&file, b"keep").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
        .args(["-s", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        raw(&out.stderr).contains("not a socket"),
        "{}",
        raw(&out.stderr)
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

/// A directory of this test's own, removed on drop (a failed test too).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `-o idle_timeout=1`: a connection that sends nothing is closed within a
/// few seconds and counted in `idle_kicks`; one that keeps sending and one
/// that streams a `watch` log stay open.
#[test]
fn idle_connections_are_closed_after_idle_timeout() {
    let both = Pair::start_alike(&["-o", "idle_timeout=1"]);
    for port in both.ports() {
        assert_eq!(setting(port, "idle_timeout"), "1");
        let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut watch = TcpStream::connect(("127.0.0.1", port)).unwrap();
        watch
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        watch.write_all(b"watch\r\n").unwrap();
        assert_eq!(raw(&read_until(&mut watch, b"OK\r\n")), "OK\r\n");
        let mut busy = Client::connect(port);
        let start = std::time::Instant::now();
        // The busy client sends every 200 ms while the idle one waits.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let n = idle.read(&mut [0u8; 16]);
            tx.send(()).unwrap();
            n.map_err(|e| e.to_string())
        });
        while rx.try_recv().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "port {port}: never closed"
            );
            assert_eq!(busy.cmd("mn"), "MN", "port {port}: the busy client kept");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            waiter.join().unwrap(),
            Ok(0),
            "port {port}: closed without a word"
        );
        assert_eq!(busy.cmd("mn"), "MN", "port {port}: the busy client kept");
        assert_eq!(busy.stat("idle_kicks"), 1, "port {port}");
        // The watcher is still there: nothing to read, no end.
        watch.set_nonblocking(true).unwrap();
        let r = watch.read(&mut [0u8; 256]);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "port {port}: the watcher got {r:?}"
        );
    }
}

#[test]
fn a_binding_protocol_reads_every_connection_in_its_protocol() {
    // `-B ascii`: a binary request is a text line like any other.
    let ascii = Pair::start_alike(&["-B", "ascii"]);
    let version = frame(0x0b, &[], &[], &[], 1);
    for port in ascii.ports() {
        let mut req = version.clone();
        req.extend_from_slice(b"\r\n");
        assert_eq!(
            raw(&send_in_one_write(port, &req, b"\r\n")),
            "ERROR\r\n",
            "port {port}"
        );
        assert_eq!(setting(port, "binding_protocol"), "ascii", "port {port}");
    }
    // `-B binary`: binary requests are served; text closes the connection
    // once a whole header's worth of it shows it is no request (a shorter
    // tail waits for more, as in memcached).
    let binary = Pair::start_alike(&["-B", "binary"]);
    for port in binary.ports() {
        let got = bin_exchange(port, std::slice::from_ref(&version));
        assert_eq!(got.len(), 1, "port {port}: {got:?}");
        assert_eq!((got[0].0, got[0].1), (0x0b, 0), "port {port}");
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s.write_all(b"version\r\n").unwrap();
        let r = s.read(&mut [0u8; 64]);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "port {port}: a short text tail got {r:?}"
        );
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"version\r\nversion\r\nversion\r\n").unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "port {port}: {:?}", raw(&rest));
    }
    // The default reads each connection's first byte.
    let auto = Pair::start_alike(&[]);
    for port in auto.ports() {
        assert_eq!(
            setting(port, "binding_protocol"),
            "auto-negotiate",
            "port {port}"
        );
        assert_eq!(bin_exchange(port, std::slice::from_ref(&version))[0].1, 0);
    }
}

#[test]
fn a_prefix_delimiter_turns_prefix_statistics_on_with_it() {
    let both = Pair::start_alike(&["-D", "/"]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    check(
        "set a/1 0 0 1\r\nx\r\nset b:2 0 0 1\r\nx\r\nget a/1\r\ndelete a/2\r\n",
        "STORED\r\nSTORED\r\nVALUE a/1 0 1\r\nx\r\nEND\r\nNOT_FOUND\r\n",
    );
    check(
        "stats detail dump\r\n",
        "PREFIX a get 1 hit 1 set 1 del 1\r\nEND\r\n",
    );
    for port in both.ports() {
        assert_eq!(setting(port, "stat_key_prefix"), "/", "port {port}");
        assert_eq!(setting(port, "detail_enabled"), "yes", "port {port}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
        .args(["-D", ""])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        raw(&out.stderr).contains("-D: no delimiter specified"),
        "{}",
        raw(&out.stderr)
    );
}

#[test]
fn enable_coredumps_raises_the_core_limit_or_refuses_to_start() {
    // With a hard limit of 0 nothing can raise it: memcached's message and
    // exit status.
    let out = Command::new("sh")
        .args([
            "-c",
            "ulimit -c 0 && ulimit -Hc 0 && exec \"$0\" -r -p 1",
            env!("CARGO_BIN_EXE_corewise-kv"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(71), "{}", raw(&out.stderr));
    assert!(
        raw(&out.stderr).contains("-r: failed to ensure corefile creation"),
        "{}",
        raw(&out.stderr)
    );
    // Otherwise the soft limit goes as far as the hard one allows.
    let mut srv = Server::start(&["-r"]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", srv.pid())).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap()
        .split_whitespace()
        .skip(4)
        .take(2)
        .collect::<Vec<_>>();
    assert_eq!(core.len(), 2, "{limits}");
    assert_eq!(
        core[0], core[1],
        "soft limit raised to the hard one: {limits}"
    );
    assert!(srv.alive());
}

#[test]
fn slab_classes_follow_the_growth_factor_and_minimum() {
    let both = Pair::start_alike(&["-f", "2", "-n", "100"]);
    let mut value = b"set k 0 0 10\r\n0123456789\r\nset k2 0 0 200\r\n".to_vec();
    value.extend_from_slice(&[b'x'; 200]);
    value.extend_from_slice(b"\r\n");
    both.check(&value, "STORED\r\nSTORED\r\n", raw);
    // The classes the two items fall in, and their chunks: 48 bytes of
    // header plus 100, rounded to 8, then doubling.
    let classes = |r: &[u8]| {
        raw(r)
            .lines()
            .filter(|l| l.contains(":chunk_size ") || l.contains(":chunks_per_page "))
            .collect::<Vec<_>>()
            .join(" ")
    };
    both.check(
        b"stats slabs\r\n",
        "STAT 1:chunk_size 152 STAT 1:chunks_per_page 6898 \
         STAT 2:chunk_size 304 STAT 2:chunks_per_page 3449",
        classes,
    );
    for port in both.ports() {
        assert_eq!(setting(port, "growth_factor"), "2.00", "port {port}");
        assert_eq!(setting(port, "chunk_size"), "100", "port {port}");
    }
    for (flag, want) in [
        ("-f1", "-f: the slab growth factor must be greater than 1"),
        ("-n0", "-n: the slab minimum size must be greater than 0"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
            .arg(flag)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag}");
        assert!(raw(&out.stderr).contains(want), "{}", raw(&out.stderr));
    }
}

#[test]
fn a_delimiter_byte_is_shown_as_it_is_and_crawler_numbers_are_cut_to_32_bits() {
    let both = Pair::start_alike(&["-D", "\u{e9}"]);
    for port in both.ports() {
        let settings = common::exchange(port, b"stats settings\r\n");
        let line = b"STAT stat_key_prefix \xc3\r\n";
        assert!(
            settings.windows(line.len()).any(|w| w == line),
            "port {port}: {}",
            raw(&settings)
        );
    }
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    check("lru_crawler sleep 4294967301\r\n", "OK\r\n");
    check("lru_crawler tocrawl 18446744073709551615\r\n", "OK\r\n");
    check(
        "lru_crawler tocrawl 18446744073709551616\r\n",
        "CLIENT_ERROR bad command line format\r\n",
    );
    for port in both.ports() {
        assert_eq!(setting(port, "lru_crawler_sleep"), "5", "port {port}");
        assert_eq!(
            setting(port, "lru_crawler_tocrawl"),
            "4294967295",
            "port {port}"
        );
    }
}
