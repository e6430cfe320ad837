//! Integration tests: the real daemon binary on a cgroup subtree of its own
//! (cgroup v1 cpuset, or cgroup v2 where that is the only hierarchy), with
//! real client processes (this test binary re-executed as a child that reads
//! commands on stdin and reports on stdout).
//!
//! Every test checks the kernel's view (cpuset `tasks`/`cgroup.threads` and
//! `cpuset.cpus` files) and where the client thread actually runs
//! (`sched_getcpu`). Waits have generous limits only so a broken daemon fails
//! instead of hanging; nothing asserts on timing. Tests need root and a
//! writable cpuset hierarchy; without them they print a notice and pass
//! vacuously... except that on this project's CI machine (cgroup v1, 2 CPUs)
//! and in its guest (`scripts/guest.sh`: cgroup v2 only, 8 CPUs in 2 sockets
//! of 2 cores of 2 hyperthreads) both are present, so they run. The tests of
//! one managed CPU use CPU 0 and the first CPU that is not its hyperthread
//! sibling (1 on the CI machine, 2 in the guest); the placement tests need
//! the guest's 8 CPUs. `COREWISE_TEST_WAIT_S` stretches the waits (the
//! guest's CPU is emulated).

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use corewise_arbiter::client;
use corewise_arbiter::topology::CpuList;

const CPUSET: &str = "/sys/fs/cgroup/cpuset";
const V2_ROOT: &str = "/sys/fs/cgroup";
const CHILD_ENV: &str = "COREWISE_ARBITER_TEST_CHILD";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// How long a wait may last before the test fails (30 s unless
/// `COREWISE_TEST_WAIT_S` says otherwise).
fn wait_limit() -> Duration {
    static W: OnceLock<Duration> = OnceLock::new();
    *W.get_or_init(|| {
        std::env::var("COREWISE_TEST_WAIT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(30), Duration::from_secs)
    })
}

/// The cpuset hierarchy the tests work in.
struct Hierarchy {
    base: PathBuf,
    v2: bool,
}

/// A cgroup v1 cpuset mount, else a cgroup v2 root whose children get the
/// cpuset controller; `None` without either.
fn hierarchy() -> Option<&'static Hierarchy> {
    static H: OnceLock<Option<Hierarchy>> = OnceLock::new();
    H.get_or_init(|| {
        if Path::new(CPUSET).join("tasks").exists() {
            return Some(Hierarchy {
                base: PathBuf::from(CPUSET),
                v2: false,
            });
        }
        let control = std::fs::read_to_string(Path::new(V2_ROOT).join("cgroup.subtree_control"))
            .unwrap_or_default();
        control
            .split_whitespace()
            .any(|c| c == "cpuset")
            .then(|| Hierarchy {
                base: PathBuf::from(V2_ROOT),
                v2: true,
            })
    })
    .as_ref()
}

fn base() -> &'static Path {
    &hierarchy().expect("checked by can_run").base
}

fn is_v2() -> bool {
    hierarchy().is_some_and(|h| h.v2)
}

/// The file listing a cgroup's threads.
fn threads_file() -> &'static str {
    if is_v2() {
        "cgroup.threads"
    } else {
        "tasks"
    }
}

/// The file a process is moved into a cgroup through.
fn procs_file() -> &'static str {
    if is_v2() {
        "cgroup.procs"
    } else {
        "tasks"
    }
}

/// The unmanaged and the managed CPU of the one-core tests: CPU 0 and the
/// first CPU that is not its hyperthread sibling.
fn pair() -> (u32, u32) {
    let sibs =
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
            .ok()
            .and_then(|t| t.trim().parse::<CpuList>().ok())
            .unwrap_or_default();
    let m = corewise_arbiter::topology::online_cpus()
        .cores()
        .find(|&c| c != 0 && !sibs.contains(c as usize))
        .unwrap_or(1);
    (0, m)
}

/// The managed CPU of the one-core tests.
fn m() -> u32 {
    pair().1
}

/// The unmanaged CPU of the one-core tests.
fn u() -> String {
    pair().0.to_string()
}

/// Both CPUs of the one-core tests, as the kernel writes a list.
fn both() -> String {
    let (a, b) = pair();
    [a as usize, b as usize]
        .into_iter()
        .collect::<CpuList>()
        .to_string()
}

// ---------------------------------------------------------------- child side

/// Entry point of the re-executed child; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Ok(socket) = std::env::var(CHILD_ENV) else {
        return;
    };
    child_main(PathBuf::from(socket));
    std::process::exit(0);
}

fn say(line: String) {
    let out = std::io::stdout();
    let mut l = out.lock();
    // libtest prints "test child_entry ... " without a newline first, so
    // every report starts on its own line behind a marker.
    let _ = writeln!(l, "\n@@ {line}");
    let _ = l.flush();
}

fn child_main(socket: PathBuf) {
    let mut client: Option<client::Client> = None;
    let mut next_thread = 0u32;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["connect"] => {
                client = Some(client::Client::connect(&socket).expect("connect"));
                say("connected".into());
            }
            ["connect-retry"] => {
                let deadline = Instant::now() + wait_limit();
                loop {
                    match client::Client::connect(&socket) {
                        Ok(c) => {
                            client = Some(c);
                            break;
                        }
                        Err(_) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(e) => panic!("reconnect: {e}"),
                    }
                }
                say("connected".into());
            }
            ["setuid", uid] => {
                let uid: u32 = uid.parse().unwrap();
                // SAFETY: setuid has no memory-safety preconditions.
                let r = unsafe { libc::setuid(uid) };
                assert_eq!(r, 0, "setuid");
                say(format!("uid {uid}"));
            }
            ["req", counts @ ..] => {
                let mut c = [0u32; 8];
                for (i, v) in counts.iter().enumerate().take(8) {
                    c[i] = v.parse().unwrap();
                }
                match client.as_ref().unwrap().set_requested_cores(c) {
                    Ok(ack) => say(format!(
                        "ack {} {}",
                        u8::from(ack.clipped),
                        ack.effective.map(|v| v.to_string()).join(" ")
                    )),
                    Err(e) => say(format!("reqerr {e}")),
                }
            }
            ["thread", mode] => {
                let idx = next_thread;
                next_thread += 1;
                let c = client.clone().unwrap();
                let stubborn = *mode == "stubborn";
                std::thread::spawn(move || kernel_thread(c, idx, stubborn));
            }
            _ => say(format!("unknown command {line}")),
        }
    }
}

fn kernel_thread(c: client::Client, idx: u32, stubborn: bool) {
    let mut me = c.thread().expect("attach thread");
    say(format!("attached {idx} {}", me.tid()));
    loop {
        let core = match me.block_until_core_available() {
            Ok(core) => core,
            Err(client::ClientError::DaemonGone) => {
                say(format!("gone {idx}"));
                return;
            }
            Err(e) => {
                say(format!("error {idx} {e}"));
                return;
            }
        };
        let cpu = rustix::thread::sched_getcpu();
        say(format!("granted {idx} {} {core} {cpu}", me.tid()));
        if stubborn {
            // Ignores release requests; notices the forced reclaim through
            // the shared page, where must_release_core also turns true.
            let p0 = c.preempted_count();
            while !me.was_preempted() {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(me.must_release_core());
            // The daemon bumps the count right after it marks the thread:
            // give the two writes a moment to both be visible.
            let t = std::time::Instant::now();
            while c.preempted_count() != p0 + 1 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(c.preempted_count(), p0 + 1);
            say(format!(
                "preempted {idx} {}",
                rustix::thread::sched_getcpu()
            ));
        } else {
            while !me.must_release_core() {
                std::thread::sleep(Duration::from_micros(200));
            }
            say(format!("releasing {idx} {core}"));
        }
    }
}

// --------------------------------------------------------------- parent side

fn can_run() -> bool {
    let ok = rustix::process::geteuid().is_root() && hierarchy().is_some();
    if !ok {
        eprintln!(
            "skipping: needs root and a cgroup v1 cpuset hierarchy at {CPUSET} or cgroup v2 \
             with cpuset in {V2_ROOT}/cgroup.subtree_control"
        );
    }
    ok
}

fn read_ids(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + wait_limit();
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Removes subtrees of earlier test runs that were killed before their guards
/// ran (their process is gone, so the sets hold no tasks of theirs).
fn remove_stale() {
    let Ok(rd) = std::fs::read_dir(base()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("corewise-test-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            drop(Sandbox {
                cg: e.path(),
                dir: std::env::temp_dir().join(&name),
            });
        }
    }
}

/// A cgroup subtree and scratch directory of one test, removed on drop.
struct Sandbox {
    cg: PathBuf,
    dir: PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        remove_stale();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("corewise-test-{}-{n}", std::process::id());
        let cg = base().join(&name);
        std::fs::create_dir(&cg).expect("mkdir test cgroup");
        let guard = Self {
            cg: cg.clone(),
            dir: std::env::temp_dir().join(&name),
        };
        // A new v1 cpuset starts empty; a v2 one inherits its parent's.
        if !is_v2() {
            for f in ["cpuset.mems", "cpuset.cpus"] {
                let v = std::fs::read_to_string(base().join(f)).unwrap();
                std::fs::write(cg.join(f), v.trim()).unwrap();
            }
        }
        std::fs::create_dir_all(&guard.dir).unwrap();
        guard
    }
    fn socket(&self) -> PathBuf {
        self.dir.join("arbiter.sock")
    }
    fn unmanaged(&self) -> PathBuf {
        self.cg.join("corewise-unmanaged")
    }
    fn core(&self, c: u32) -> PathBuf {
        self.cg.join(format!("corewise-core{c}"))
    }
    fn core_tasks(&self, c: u32) -> Vec<u32> {
        read_ids(&self.core(c).join(threads_file()))
    }
    fn unmanaged_tasks(&self) -> Vec<u32> {
        read_ids(&self.unmanaged().join(threads_file()))
    }
    fn unmanaged_cpus(&self) -> String {
        std::fs::read_to_string(self.unmanaged().join("cpuset.cpus"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }
    fn subdirs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.cg)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        fn empty(dir: &Path) {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        empty(&e.path());
                    }
                }
            }
            for tid in read_ids(&dir.join(threads_file())) {
                let _ = std::fs::write(base().join(procs_file()), tid.to_string());
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(dir).is_err() && dir.exists() && Instant::now() < deadline {
                for tid in read_ids(&dir.join(threads_file())) {
                    let _ = std::fs::write(base().join(procs_file()), tid.to_string());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        empty(&self.cg);
        if self.cg.exists() {
            eprintln!("warning: could not remove {}", self.cg.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon process; SIGTERM (then SIGKILL) on drop.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    fn start(sb: &Sandbox, extra: &[&str]) -> Self {
        let log = sb.dir.join(format!(
            "daemon-{}.log",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let mut args: Vec<String> = vec![
            "run".into(),
            "--socket".into(),
            sb.socket().display().to_string(),
        ];
        if !extra.contains(&"--cpus") {
            args.push("--cpus".into());
            args.push(both());
        }
        if !extra.contains(&"affinity") {
            args.push("--cgroup-root".into());
            args.push(sb.cg.display().to_string());
        }
        if !extra.contains(&"--warm-window-us") {
            // Only the warm-window test's daemon may write the CPU's PM QoS
            // file (a machine-wide setting that parallel tests would race on).
            args.push("--warm-window-us".into());
            args.push("0".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(env!("CARGO_BIN_EXE_corewise-arbiter"))
            .args(&args)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn daemon");
        let d = Self {
            child: Some(child),
            log,
        };
        let sock = sb.socket();
        wait_until("daemon socket answers", || client::status(&sock).is_ok());
        d
    }
    /// SIGTERM and wait; returns whether it exited successfully.
    fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + wait_limit();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let clean = self.child.is_none() || self.stop();
        if std::thread::panicking() || !clean {
            eprintln!(
                "--- daemon log {} ---\n{}",
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// Any child process, killed on drop (even when a test fails).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client process driven over stdin/stdout.
struct App {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pending: VecDeque<String>,
    /// Core of each kernel thread (by tid) as its reports tell, for
    /// [`App::reported_cores`].
    reported: BTreeMap<u32, u32>,
}

impl App {
    fn spawn(sb: &Sandbox) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, sb.socket())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn client");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let Some((_, msg)) = l.split_once("@@ ") else {
                    continue;
                };
                if tx.send(msg.to_string()).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
            pending: VecDeque::new(),
            reported: BTreeMap::new(),
        }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn cmd(&mut self, c: &str) {
        writeln!(self.stdin, "{c}").expect("write to client");
    }
    /// Waits for a line starting with `word`; returns its other fields.
    fn expect(&mut self, word: &str) -> Vec<String> {
        let matches = |l: &str| l.split_whitespace().next() == Some(word);
        if let Some(i) = self.pending.iter().position(|l| matches(l)) {
            let l = self.pending.remove(i).unwrap();
            return l.split_whitespace().skip(1).map(String::from).collect();
        }
        let deadline = Instant::now() + wait_limit();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if matches(&l) => {
                    return l.split_whitespace().skip(1).map(String::from).collect()
                }
                Ok(l) => {
                    assert!(
                        !l.starts_with("error") && !l.starts_with("unknown"),
                        "client reported: {l}"
                    );
                    self.pending.push_back(l)
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no '{word}' from client; seen {:?}", self.pending)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("client exited before '{word}'; seen {:?}", self.pending)
                }
            }
        }
    }
    fn connect(&mut self) {
        self.cmd("connect");
        self.expect("connected");
    }
    /// Starts a kernel thread; returns its tid.
    fn thread(&mut self, mode: &str) -> u32 {
        self.cmd(&format!("thread {mode}"));
        self.expect("attached")[1].parse().unwrap()
    }
    /// Sends a request; returns (clipped, effective).
    fn request(&mut self, counts: [u32; 8]) -> (bool, Vec<u32>) {
        self.cmd(&format!("req {}", counts.map(|c| c.to_string()).join(" ")));
        let f = self.expect("ack");
        (
            f[0] == "1",
            f[1..].iter().map(|v| v.parse().unwrap()).collect(),
        )
    }
    /// Waits for a grant; returns (tid, core, cpu the thread runs on).
    fn granted(&mut self) -> (u32, u32, u32) {
        let f = self.expect("granted");
        (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        )
    }
    /// The cores the application's kernel threads hold by their own
    /// reports so far (each grant checked against `sched_getcpu`), sorted.
    fn reported_cores(&mut self) -> Vec<u32> {
        while let Ok(l) = self.lines.try_recv() {
            self.pending.push_back(l);
        }
        let mut rest = VecDeque::new();
        for l in self.pending.drain(..) {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["granted", _, tid, core, cpu] => {
                    assert_eq!(core, cpu, "a granted thread runs on its core: {l}");
                    self.reported
                        .insert(tid.parse().unwrap(), core.parse().unwrap());
                }
                ["releasing", _, core] => {
                    let core: u32 = core.parse().unwrap();
                    self.reported.retain(|_, c| *c != core);
                }
                _ => rest.push_back(l),
            }
        }
        self.pending = rest;
        let mut v: Vec<u32> = self.reported.values().copied().collect();
        v.sort();
        v
    }
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn level(l: usize, n: u32) -> [u32; 8] {
    let mut c = [0; 8];
    c[l] = n;
    c
}

fn status_of(sb: &Sandbox, pid: u32) -> Option<corewise_arbiter::protocol::StatusEntry> {
    client::status(sb.socket())
        .unwrap()
        .into_iter()
        .find(|e| e.pid == pid)
}

/// Asserts the kernel's view: `tid` alone confined to the managed core
/// ("core 1": [`m`]), which is out of the unmanaged set.
fn assert_holds_core1(sb: &Sandbox, tid: u32, cpu: u32) {
    assert_eq!(cpu, m(), "granted thread must run on the managed core");
    assert_eq!(
        sb.core_tasks(m()),
        vec![tid],
        "managed core's cpuset members"
    );
    assert_eq!(
        sb.unmanaged_cpus(),
        u(),
        "the managed core must leave the unmanaged set"
    );
}

fn assert_core1_free(sb: &Sandbox) {
    wait_until("core 1 back in the unmanaged set", || {
        sb.core_tasks(m()).is_empty() && sb.unmanaged_cpus() == both()
    });
}

fn assert_cleaned(sb: &Sandbox) {
    assert!(
        sb.subdirs().is_empty(),
        "daemon left cgroups behind: {:?}",
        sb.subdirs()
    );
}

// -------------------------------------------------------------------- tests

#[test]
fn grant_and_cooperative_release() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    // An unrelated task living in the daemon's root before it starts.
    let bystander = KillOnDrop(Command::new("sleep").arg("600").spawn().unwrap());
    let by = bystander.0.id();
    std::fs::write(sb.cg.join(procs_file()), by.to_string()).unwrap();
    let allowed = move || {
        std::fs::read_to_string(format!("/proc/{by}/status"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
            .unwrap()
    };
    // A long timeout so the release is surely the cooperative one.
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    assert_eq!(sb.unmanaged_cpus(), both());
    assert!(sb.core(m()).exists() && !sb.core(0).exists());
    assert!(
        sb.unmanaged_tasks().contains(&by),
        "existing tasks move to the unmanaged set"
    );
    assert!(read_ids(&sb.cg.join(threads_file())).is_empty());

    let mut a = App::spawn(&sb);
    a.connect();
    let tid = a.thread("coop");
    // Registered but not yet wanted: the thread waits in the unmanaged set.
    wait_until("thread waiting", || {
        status_of(&sb, a.pid()).is_some_and(|e| e.granted.is_empty())
    });
    assert!(sb.core_tasks(m()).is_empty());

    let (clipped, eff) = a.request(level(0, 1));
    assert!(!clipped);
    assert_eq!(eff, level(0, 1).to_vec());
    let (gtid, core, cpu) = a.granted();
    assert_eq!((gtid, core), (tid, m()));
    assert_holds_core1(&sb, tid, cpu);
    assert_eq!(
        allowed(),
        u(),
        "other tasks are fenced off the granted core"
    );
    let st = status_of(&sb, a.pid()).unwrap();
    assert_eq!(st.granted, vec![m()]);
    assert_eq!(st.requested, level(0, 1));

    // The status command prints the table.
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-arbiter"))
        .args(["status", "--socket"])
        .arg(sb.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let row = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&a.pid().to_string()))
        .unwrap_or_else(|| panic!("no row for the client in:\n{text}"));
    assert!(row.contains("1,0,0,0,0,0,0,0"), "{row}");

    // Cooperative release: the thread sees the flag and blocks again.
    a.request([0; 8]);
    assert_eq!(a.expect("releasing")[1], m().to_string());
    assert_core1_free(&sb);
    assert_eq!(allowed(), both());
    wait_until("released thread parked in the unmanaged set", || {
        sb.unmanaged_tasks().contains(&tid)
    });
    assert_eq!(status_of(&sb, a.pid()).unwrap().preempted, 0);

    // And it can have the core again.
    a.request(level(3, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid, cpu);

    drop(a);
    assert_core1_free(&sb);
    assert!(d.stop(), "daemon must exit cleanly on SIGTERM");
    assert_cleaned(&sb);
    assert!(
        read_ids(&sb.cg.join(threads_file())).contains(&by),
        "tasks move back to the root on exit"
    );
    drop(bystander);
}

#[test]
fn forced_release_after_timeout() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "30"]);
    let mut low = App::spawn(&sb);
    low.connect();
    let low_tid = low.thread("stubborn");
    low.request(level(7, 1));
    let (_, _, cpu) = low.granted();
    assert_holds_core1(&sb, low_tid, cpu);

    let mut high = App::spawn(&sb);
    high.connect();
    let high_tid = high.thread("coop");
    high.request(level(0, 1));
    // The low app ignores the release flag; the daemon takes the core.
    let f = high.granted();
    let cpu_after: u32 = low.expect("preempted")[1].parse().unwrap();
    assert_eq!(
        cpu_after.to_string(),
        u(),
        "a preempted thread runs on the unmanaged core"
    );
    assert_holds_core1(&sb, high_tid, f.2);
    assert!(sb.unmanaged_tasks().contains(&low_tid));
    assert_eq!(status_of(&sb, low.pid()).unwrap().preempted, 1);
    assert!(status_of(&sb, low.pid()).unwrap().granted.is_empty());

    // The preempted thread blocks again and gets the core back when the
    // high-priority application lets go.
    high.request([0; 8]);
    high.expect("releasing");
    let (t, _, cpu) = low.granted();
    assert_eq!(t, low_tid);
    assert_holds_core1(&sb, low_tid, cpu);

    drop(low);
    drop(high);
    assert_core1_free(&sb);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn two_priorities_cooperate() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    let mut low = App::spawn(&sb);
    low.connect();
    let low_tid = low.thread("coop");
    low.request(level(6, 1));
    let (_, _, cpu) = low.granted();
    assert_holds_core1(&sb, low_tid, cpu);

    let mut high = App::spawn(&sb);
    high.connect();
    let high_tid = high.thread("coop");
    high.request(level(1, 1));
    low.expect("releasing");
    let (_, _, cpu) = high.granted();
    assert_holds_core1(&sb, high_tid, cpu);
    assert!(sb.unmanaged_tasks().contains(&low_tid));
    assert_eq!(status_of(&sb, low.pid()).unwrap().preempted, 0);

    // Lower priority than what low asks: nothing moves... then high leaves.
    high.request([0; 8]);
    high.expect("releasing");
    let (_, _, cpu) = low.granted();
    assert_holds_core1(&sb, low_tid, cpu);
    assert!(sb.unmanaged_tasks().contains(&high_tid));

    drop(low);
    drop(high);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn equal_split_at_one_priority() {
    if !can_run() {
        return;
    }
    // One managed core and two applications at the same level: the split is
    // one core and nothing, and the holder keeps it (no churn) until it lets
    // go. (Splits over more cores are covered by the policy unit tests.)
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    let mut a = App::spawn(&sb);
    a.connect();
    // Two kernel threads each; which one of them gets the core is up to
    // the order in which they block, so the test follows the reports.
    let a_tids = [a.thread("coop"), a.thread("coop")];
    let mut b = App::spawn(&sb);
    b.connect();
    let b_tids = [b.thread("coop"), b.thread("coop")];
    a.request(level(2, 2));
    let (a_tid, _, cpu) = a.granted();
    assert!(a_tids.contains(&a_tid));
    assert_holds_core1(&sb, a_tid, cpu);
    b.request(level(2, 2));
    // b waits; a keeps its core. Check the daemon's view once b's request
    // has been applied (the ack came back).
    let sa = status_of(&sb, a.pid()).unwrap();
    let sb_ = status_of(&sb, b.pid()).unwrap();
    assert_eq!(sa.granted.len() + sb_.granted.len(), 1);
    assert_eq!(sa.granted, vec![m()]);
    assert_eq!(sb.core_tasks(m()), vec![a_tid]);

    a.request([0; 8]);
    a.expect("releasing");
    let (b_tid, _, cpu) = b.granted();
    assert!(b_tids.contains(&b_tid));
    assert_holds_core1(&sb, b_tid, cpu);

    drop(a);
    drop(b);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn crash_returns_cores_at_once() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    // Even with a huge reclaim timeout, a dead client's core is free at once.
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "60000"]);
    let mut a = App::spawn(&sb);
    a.connect();
    let a_tid = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, a_tid, cpu);

    let mut b = App::spawn(&sb);
    b.connect();
    let b_tid = b.thread("coop");
    b.request(level(7, 1));
    assert_eq!(sb.core_tasks(m()), vec![a_tid]);

    let a_pid = a.pid();
    a.kill9();
    let (t, _, cpu) = b.granted();
    assert_eq!(t, b_tid);
    assert_holds_core1(&sb, b_tid, cpu);
    assert!(
        status_of(&sb, a_pid).is_none(),
        "dead application must be gone"
    );

    drop(b);
    assert_core1_free(&sb);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn limits_from_config_file() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let cfg = sb.dir.join("limits.toml");
    std::fs::write(
        &cfg,
        "[defaults]\nmax_cores = 8\n\n[users.\"65534\"]\nmax_cores = 1\nmax_priority = 5\n",
    )
    .unwrap();
    // The unprivileged client must reach the socket.
    std::fs::set_permissions(&sb.dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut d = Daemon::start(
        &sb,
        &[
            "--reclaim-timeout-ms",
            "20000",
            "--config",
            cfg.to_str().unwrap(),
        ],
    );
    let mut nobody = App::spawn(&sb);
    nobody.cmd("setuid 65534");
    nobody.expect("uid");
    nobody.connect();
    let n_tids = [nobody.thread("coop"), nobody.thread("coop")];
    let (clipped, eff) = nobody.request(level(0, 2));
    assert!(clipped, "a request beyond the limits is clipped");
    assert_eq!(eff, level(5, 1).to_vec());
    let (n_tid, _, cpu) = nobody.granted();
    assert!(n_tids.contains(&n_tid));
    assert_holds_core1(&sb, n_tid, cpu);
    assert_eq!(status_of(&sb, nobody.pid()).unwrap().uid, 65534);

    // root at level 2 beats nobody's (clipped) level 0 request.
    let mut root = App::spawn(&sb);
    root.connect();
    let r_tid = root.thread("coop");
    let (clipped, _) = root.request(level(2, 1));
    assert!(!clipped);
    nobody.expect("releasing");
    let (_, _, cpu) = root.granted();
    assert_holds_core1(&sb, r_tid, cpu);

    drop(root);
    drop(nobody);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn malformed_clients_are_dropped_alone() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    let mut a = App::spawn(&sb);
    a.connect();
    let tid = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid, cpu);

    use corewise_arbiter::protocol::{encode_request, Request};
    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        vec![b'C', b'W', 99, 1, 0, 0],
        vec![b'C', b'W', 1, 77, 0, 0],
        vec![b'C', b'W', 1, 3, 0xff, 0xff],
        // Valid messages in the wrong place.
        encode_request(&Request::SetRequestedCores { counts: [1; 8] }),
        encode_request(&Request::BlockUntilCoreAvailable),
        encode_request(&Request::AttachThread {
            app_token: 12345,
            tid: std::process::id(),
        }),
        [
            encode_request(&Request::HelloApp),
            encode_request(&Request::HelloApp),
        ]
        .concat(),
    ];
    for g in &garbage {
        assert!(
            client::send_raw(sb.socket(), g).unwrap(),
            "daemon must close a connection that sent {g:?}"
        );
    }
    // The well-behaved client still holds its core and still works.
    assert_holds_core1(&sb, tid, m());
    a.request([0; 8]);
    a.expect("releasing");
    assert_core1_free(&sb);
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid, cpu);

    drop(a);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn daemon_restart_with_live_clients() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    let mut a = App::spawn(&sb);
    a.connect();
    let tid = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid, cpu);

    // Orderly stop: the client is told through the shared page, gives the
    // core back and learns the daemon is gone; everything is removed.
    assert!(d.stop());
    a.expect("releasing");
    a.expect("gone");
    assert_cleaned(&sb);
    assert!(
        read_ids(&sb.cg.join(threads_file())).contains(&tid)
            || !Path::new(&format!("/proc/{}/task/{tid}", a.pid())).exists()
    );

    // A new daemon: the same process reconnects and gets the core again.
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    a.cmd("connect-retry");
    a.expect("connected");
    let tid2 = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid2, cpu);

    // A crash of the daemon (kill -9) leaves its cgroups; the next daemon
    // adopts them and frees the core before granting it again.
    d.kill9();
    assert_eq!(
        sb.core_tasks(m()),
        vec![tid2],
        "cpusets survive a daemon crash"
    );
    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "20000"]);
    assert!(
        sb.core_tasks(m()).is_empty(),
        "stale core set emptied at start"
    );
    assert!(sb.unmanaged_tasks().contains(&tid2));
    assert_eq!(sb.unmanaged_cpus(), both());
    a.cmd("connect-retry");
    a.expect("connected");
    let tid3 = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid3, cpu);

    drop(a);
    assert!(d.stop());
    assert_cleaned(&sb);
}

/// The managed core's PM QoS limit.
fn pm_qos_path() -> PathBuf {
    PathBuf::from(format!(
        "/sys/devices/system/cpu/cpu{}/power/pm_qos_resume_latency_us",
        m()
    ))
}

fn pm_qos_cpu1() -> String {
    std::fs::read_to_string(pm_qos_path())
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Puts CPU 1's PM QoS limit back even when the test fails.
struct RestorePmQos(String);

impl Drop for RestorePmQos {
    fn drop(&mut self) {
        let _ = std::fs::write(pm_qos_path(), &self.0);
    }
}

#[test]
fn warm_window_keeps_a_freed_core_polling() {
    if !can_run() {
        return;
    }
    let original = pm_qos_cpu1();
    if original.is_empty() || original == "n/a" {
        eprintln!("skipping: no PM QoS limit to manage on cpu1 ({original:?})");
        return;
    }
    let _restore = RestorePmQos(original.clone());
    let sb = Sandbox::new();
    let warm = [
        "--reclaim-timeout-ms",
        "20000",
        "--warm-window-us",
        "300000",
    ];
    let mut d = Daemon::start(&sb, &warm);
    let record = PathBuf::from(format!("{}.pmqos", sb.socket().display()));
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        format!("{} {original}\n", m())
    );
    let mut a = App::spawn(&sb);
    a.connect();
    let tid = a.thread("coop");
    a.request(level(0, 1));
    let (_, _, cpu) = a.granted();
    assert_holds_core1(&sb, tid, cpu);
    assert_eq!(pm_qos_cpu1(), original, "a held core sleeps as usual");

    // Released: the core polls for the window, then gets its limit back.
    a.request([0; 8]);
    a.expect("releasing");
    assert_core1_free(&sb);
    wait_until("freed core polling", || pm_qos_cpu1() == "n/a");
    wait_until("window over", || pm_qos_cpu1() == original);

    // Granted within the window: the limit comes back at the grant.
    a.request(level(0, 1));
    a.granted();
    a.request([0; 8]);
    a.expect("releasing");
    wait_until("freed core polling", || pm_qos_cpu1() == "n/a");
    a.request(level(0, 1));
    a.granted();
    wait_until("granted core sleeps as usual", || pm_qos_cpu1() == original);

    // A daemon killed in a window leaves the core polling; the next one
    // restores it from the record before anything else.
    a.request([0; 8]);
    a.expect("releasing");
    wait_until("freed core polling", || pm_qos_cpu1() == "n/a");
    d.kill9();
    assert_eq!(pm_qos_cpu1(), "n/a");
    let mut d = Daemon::start(&sb, &warm);
    assert_eq!(pm_qos_cpu1(), original, "restored from the record");
    drop(a);
    assert!(d.stop());
    assert!(!record.exists(), "a clean exit removes the record");
    assert_eq!(pm_qos_cpu1(), original);
    assert_cleaned(&sb);
}

/// A cgroup directory of one test (v1 or v2), removed on drop.
struct CgroupDir(PathBuf);

impl Drop for CgroupDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(&self.0) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn cgroup_v2_without_cpuset_fails_cleanly() {
    const V2: &str = "/sys/fs/cgroup/unified";
    if !can_run() || !Path::new(V2).join("cgroup.controllers").exists() {
        return;
    }
    let dir = CgroupDir(Path::new(V2).join(format!("corewise-test-v2-{}", std::process::id())));
    std::fs::create_dir(&dir.0).unwrap();
    let controllers = std::fs::read_to_string(dir.0.join("cgroup.controllers")).unwrap();
    if controllers.split_whitespace().any(|c| c == "cpuset") {
        eprintln!("skipping: cpuset is available in cgroup v2 here");
        return;
    }
    assert_daemon_refuses(&dir.0, "cgroup-v2", "cpuset controller is not available");
    assert_eq!(
        std::fs::read_to_string(dir.0.join("cgroup.type"))
            .unwrap()
            .trim(),
        "domain",
        "the root is left as it was"
    );
}

/// Runs the daemon on `root` with `backend` and checks that it fails with
/// `reason`, creating no cgroup under `root` and leaving no socket.
fn assert_daemon_refuses(root: &Path, backend: &str, reason: &str) {
    let sock = std::env::temp_dir().join(format!(
        "corewise-test-refuse-{}-{backend}.sock",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_corewise-arbiter"))
        .args(["run", "--backend", backend, "--cpus", &both(), "--socket"])
        .arg(&sock)
        .arg("--cgroup-root")
        .arg(root)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(reason), "a clear reason: {err}");
    let subdirs: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(subdirs.is_empty(), "nothing created: {subdirs:?}");
    assert!(!sock.exists(), "no socket left behind");
}

#[test]
fn affinity_backend_pins_threads() {
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = Daemon::start(
        &sb,
        &["--backend", "affinity", "--reclaim-timeout-ms", "20000"],
    );
    assert!(
        sb.subdirs().is_empty(),
        "affinity backend creates no cgroups"
    );
    let mut a = App::spawn(&sb);
    a.connect();
    let tid = a.thread("coop");
    a.request(level(0, 1));
    let (_, core, cpu) = a.granted();
    assert_eq!((core, cpu), (m(), m()));
    let pid = a.pid();
    let allowed = move |tid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
            .unwrap()
    };
    assert_eq!(allowed(tid), m().to_string());
    a.request([0; 8]);
    a.expect("releasing");
    wait_until("thread unpinned to the unmanaged CPUs", || {
        allowed(tid) == both()
    });
    drop(a);
    assert!(d.stop());
}

#[test]
fn an_empty_v1_cgroup_root_fails_with_a_clear_reason() {
    if !can_run() || is_v2() {
        return;
    }
    // A cpuset made with mkdir: no CPUs, no memory nodes yet.
    let dir =
        CgroupDir(Path::new(CPUSET).join(format!("corewise-test-empty-{}", std::process::id())));
    std::fs::create_dir(&dir.0).unwrap();
    assert_daemon_refuses(&dir.0, "cgroup-v1", "cpuset.cpus is empty");
}

/// Whether this is the guest's machine: 8 CPUs, 2 sockets of 2 cores of 2
/// hyperthreads, numbered socket-major (0-3 on socket 0; 0,1 siblings).
fn two_sockets_of_hyperthreads() -> bool {
    let all = corewise_arbiter::topology::online_cpus();
    let topo = corewise_arbiter::topology::Topology::read(&all);
    let ok = all.len() == 8
        && all
            .cores()
            .all(|c| topo.siblings(c) == vec![c & !1, c | 1] && topo.package_of(c) == Some(c / 4));
    if !ok {
        eprintln!("skipping: needs 8 CPUs in 2 sockets x 2 cores x 2 threads (scripts/guest.sh)");
    }
    ok
}

/// Waits until every application holds exactly its CPUs in `want` by the
/// daemon's status, the kernel's cpusets (one thread of the application in
/// each held CPU's set) and the threads' own reports, and the unmanaged set
/// is `unmanaged`.
fn wait_holdings(sb: &Sandbox, apps: &mut [&mut App], want: &[&[u32]], unmanaged: &str) {
    let deadline = Instant::now() + wait_limit();
    loop {
        let mut seen = Vec::new();
        let mut ok = sb.unmanaged_cpus() == unmanaged;
        for (app, &cpus) in apps.iter_mut().zip(want) {
            let pid = app.pid();
            let status = status_of(sb, pid).map(|e| e.granted).unwrap_or_default();
            let members_ok = cpus.iter().all(|&c| {
                let m = sb.core_tasks(c);
                m.len() == 1 && Path::new(&format!("/proc/{pid}/task/{}", m[0])).exists()
            });
            let reported = app.reported_cores();
            ok &= status == cpus && members_ok && reported == cpus;
            seen.push((status, reported));
        }
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "want {want:?} (unmanaged {unmanaged}), have (status, reported) {seen:?}, unmanaged {}",
            sb.unmanaged_cpus()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An application with `n` cooperative kernel threads.
fn app_with_threads(sb: &Sandbox, n: usize) -> App {
    let mut a = App::spawn(sb);
    a.connect();
    for _ in 0..n {
        a.thread("coop");
    }
    a
}

#[test]
fn six_cpus_split_by_whole_cores_and_sockets() {
    if !can_run() || !two_sockets_of_hyperthreads() {
        return;
    }
    // CPUs 0-1 (one physical core) stay unmanaged; 2-7 are three physical
    // cores: (2,3) on socket 0, (4,5) and (6,7) on socket 1.
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--cpus", "0-7", "--reclaim-timeout-ms", "600000"]);
    let mut a = app_with_threads(&sb, 3);
    let mut b = app_with_threads(&sb, 3);
    let mut c = app_with_threads(&sb, 3);

    // Alone, A asking for 3 CPUs gets two physical cores on the socket with
    // the most free CPUs, siblings first.
    a.request(level(2, 3));
    wait_holdings(&sb, &mut [&mut a], &[&[4, 5, 6]], "0-3");
    // B's equal share of the three cores is one; it takes the free whole
    // core, not CPU 7 (the sibling of A's 6).
    b.request(level(2, 3));
    wait_holdings(&sb, &mut [&mut a, &mut b], &[&[4, 5, 6], &[2, 3]], "0-1");
    // C: one core each. A gives back 6, the CPU whose loss splits no pair,
    // and C gets both 6 and 7.
    c.request(level(2, 3));
    wait_holdings(
        &sb,
        &mut [&mut a, &mut b, &mut c],
        &[&[4, 5], &[2, 3], &[6, 7]],
        "0-1",
    );

    // A more important application takes the youngest application's core,
    // whole; when it crashes C gets it back.
    let mut h = app_with_threads(&sb, 2);
    h.request(level(0, 2));
    wait_holdings(
        &sb,
        &mut [&mut a, &mut b, &mut c, &mut h],
        &[&[4, 5], &[2, 3], &[], &[6, 7]],
        "0-1",
    );
    h.kill9();
    wait_holdings(
        &sb,
        &mut [&mut a, &mut b, &mut c],
        &[&[4, 5], &[2, 3], &[6, 7]],
        "0-1",
    );

    // A leaves the field: C (still asking for 3) grows onto A's core; B,
    // down to one CPU, keeps 2 and its sibling stays fenced.
    a.request([0; 8]);
    b.request(level(2, 1));
    wait_holdings(
        &sb,
        &mut [&mut a, &mut b, &mut c],
        &[&[], &[2], &[4, 6, 7]],
        "0-1",
    );
    // Everyone down: the unmanaged set gets every CPU back.
    b.request([0; 8]);
    c.request([0; 8]);
    wait_holdings(&sb, &mut [&mut a, &mut b, &mut c], &[&[], &[], &[]], "0-7");

    drop(a);
    drop(b);
    drop(c);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn one_application_fills_a_socket_before_the_other() {
    if !can_run() || !two_sockets_of_hyperthreads() {
        return;
    }
    // With CPUs 0-3 and 4-7 on two sockets and 0-1 unmanaged, socket 1 has
    // the most free CPUs: a 4-CPU application gets it whole, and grows onto
    // socket 0 only past that.
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--cpus", "0-7", "--reclaim-timeout-ms", "600000"]);
    let mut a = app_with_threads(&sb, 6);
    a.request(level(1, 4));
    wait_holdings(&sb, &mut [&mut a], &[&[4, 5, 6, 7]], "0-3");
    a.request(level(1, 6));
    wait_holdings(&sb, &mut [&mut a], &[&[2, 3, 4, 5, 6, 7]], "0-1");
    // Shrinking keeps a socket whole: the pair on socket 0 goes first.
    a.request(level(1, 4));
    wait_holdings(&sb, &mut [&mut a], &[&[4, 5, 6, 7]], "0-3");
    drop(a);
    assert!(d.stop());
    assert_cleaned(&sb);
}

#[test]
fn restart_after_a_crash_cleans_up_another_layout() {
    if !can_run() || !two_sockets_of_hyperthreads() {
        return;
    }
    // A daemon managing CPUs 2-7 is killed while an application holds
    // 4 and 5; the next one manages only the one-core tests' CPU: it must
    // replace the stale socket, move the threads out of every old core set
    // (also those it does not manage), remove those sets, and give the
    // unmanaged set all its CPUs back.
    let sb = Sandbox::new();
    let mut d = Daemon::start(&sb, &["--cpus", "0-7", "--reclaim-timeout-ms", "600000"]);
    let mut a = app_with_threads(&sb, 2);
    a.request(level(0, 2));
    wait_holdings(&sb, &mut [&mut a], &[&[4, 5]], "0-3,6-7");
    let held: Vec<u32> = [4, 5].iter().flat_map(|&c| sb.core_tasks(c)).collect();
    d.kill9();
    assert!(sb.socket().exists(), "a killed daemon leaves its socket");
    assert_eq!(sb.core_tasks(4).len(), 1, "and its sets");

    let mut d = Daemon::start(&sb, &["--reclaim-timeout-ms", "600000"]);
    let dirs: Vec<String> = sb
        .subdirs()
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
        .collect();
    let mut want = vec![
        format!("corewise-core{}", m()),
        "corewise-unmanaged".to_string(),
    ];
    want.sort();
    assert_eq!(dirs, want, "only this daemon's sets remain");
    assert_eq!(sb.unmanaged_cpus(), both());
    let unmanaged = sb.unmanaged_tasks();
    assert!(
        held.iter().all(|t| unmanaged.contains(t)),
        "{held:?} in the unmanaged set ({unmanaged:?})"
    );
    // The application registers again and gets the one managed core.
    a.cmd("connect-retry");
    a.expect("connected");
    let tid = a.thread("coop");
    a.request(level(0, 1));
    let (t, _, cpu) = a.granted();
    assert_eq!(t, tid);
    assert_holds_core1(&sb, tid, cpu);
    drop(a);
    assert!(d.stop());
    assert_cleaned(&sb);
}
