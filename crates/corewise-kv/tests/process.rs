//! memcached's process flags, as distributions pass them (Debian's
//! `/etc/memcached.conf` has `-d`, `-u memcache` and `-P`): the server
//! detaches, writes its pid, runs as the user, and serves.

mod common;

use common::{free_port, Client, Server};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `Uid:` or `Gid:` line of process `pid` (real, effective, saved, fs).
fn ids(pid: u32, which: &str) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(which))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

/// As root, `-u nobody` runs every thread of the server as nobody (user
/// and group), and it serves.
#[test]
fn runs_as_the_user_it_is_given() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: -u switches users only when started as root");
        return;
    }
    let s = Server::start(&["-u", "nobody"]);
    let mut c = s.client();
    assert_eq!(c.store("set k 0 0 1", b"x"), "STORED");
    assert_eq!(c.cmd("get k"), "VALUE k 0 1");
    let tasks = std::fs::read_dir(format!("/proc/{}/task", s.pid())).unwrap();
    let mut n = 0;
    for t in tasks {
        let tid: u32 = t.unwrap().file_name().to_str().unwrap().parse().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/task/{tid}/status", s.pid()));
        let Ok(status) = status else { continue };
        let line = |w: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(w))
                .unwrap()
                .split_whitespace()
                .map(|v| v.parse::<u32>().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(line("Uid:"), vec![65534; 4], "thread {tid}");
        assert_eq!(line("Gid:"), vec![65534; 4], "thread {tid}");
        n += 1;
    }
    assert!(n > 1, "the runtime's threads were checked too");
    assert_eq!(ids(s.pid(), "Uid:"), vec![65534; 4]);
}

/// A user that does not exist: a clear error and no server.
#[test]
fn an_unknown_user_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: -u is looked at only when started as root");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
        .args(["-p", &free_port().to_string(), "-u", "no-such-user-here"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("can't find the user no-such-user-here"),
        "{err}"
    );
}

/// `-d -P file`: the command returns at once with status 0, the server
/// goes on in a new session with its pid in the file, and serves.
#[test]
fn detaches_and_writes_its_pid() {
    let dir = std::env::temp_dir().join(format!("kv-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("kv.pid");
    let port = free_port();
    let status = Command::new(env!("CARGO_BIN_EXE_corewise-kv"))
        .args(["-p", &port.to_string(), "-l", "127.0.0.1", "-d", "-P"])
        .arg(&pid_file)
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the launching process exits 0");
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid: u32 = loop {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.strip_suffix('\n').and_then(|p| p.parse().ok()))
        {
            break p;
        }
        assert!(Instant::now() < deadline, "no pid file");
        std::thread::sleep(Duration::from_millis(10));
    };
    /// Stops the detached server (ours: its pid is in our pid file).
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: a signal to the server this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let _kill = Kill(pid);
    let mut c = loop {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            drop(s);
            break Client::connect(port);
        }
        assert!(Instant::now() < deadline, "the server does not accept");
        std::thread::sleep(Duration::from_millis(10));
    };
    c.send(b"stats\r\n");
    let mut stats_pid = None;
    loop {
        let l = c.line();
        if let Some(p) = l.strip_prefix("STAT pid ") {
            stats_pid = p.parse::<u32>().ok();
        }
        if l == "END" {
            break;
        }
    }
    assert_eq!(stats_pid, Some(pid), "the pid file names the server");
    assert_eq!(c.store("set k 0 0 1", b"x"), "STORED");
    // A session of its own (setsid): field 6 of stat is the session id.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let session: u32 = after.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(session, pid);
    drop(_kill);
    let _ = std::fs::remove_dir_all(&dir);
}
