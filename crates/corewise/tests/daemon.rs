//! The runtime as a client of the real core arbiter daemon.
//!
//! The daemon (`corewise_arbiter::daemon::spawn`, the same code as the
//! binary) runs on a thread of this test process, on a cpuset subtree of the
//! test's own (`--cgroup-root`; cgroup v1, or cgroup v2 where that is the
//! only hierarchy, as in `scripts/guest.sh`), with its own socket. The
//! test process moves into that subtree first, so the daemon puts every
//! thread of it, and of the child processes it starts, in its unmanaged set:
//! kernel threads only reach a managed CPU when the daemon grants it. Guards
//! stop the daemon, move the process back and remove the subtree even when
//! a test fails. A second application is this test binary re-executed with
//! an environment variable.
//!
//! The daemon gets two CPUs, CPU 0 and the first CPU that is not its
//! hyperthread sibling, and keeps one unmanaged: there is exactly one
//! managed core, so the tests are built around one core changing hands.
//! Waits have generous limits only so that a broken build fails instead of
//! hanging; nothing asserts on timing (`COREWISE_TEST_WAIT_S` stretches
//! them and `COREWISE_TEST_RECLAIM_MS` sets the daemon's reclaim timeout,
//! for the guest's emulated CPU). The tests need root and a cpuset
//! hierarchy (except the fallback test); without them they say so and pass.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use corewise::arbiter::{ArbiterChoice, ArbiterKind, ARBITER_ENV};
use corewise::Runtime;
use corewise_arbiter::daemon::{self, Backend, DaemonHandle, Options};

const CPUSET: &str = "/sys/fs/cgroup/cpuset";
const V2_ROOT: &str = "/sys/fs/cgroup";
/// Child mode: `high` (a priority-0 application), `env-fallback`, or
/// `daemon` (the core arbiter daemon, a process of its own).
const CHILD_ENV: &str = "COREWISE_DAEMON_TEST_CHILD";
/// The managed CPU, for the `high` child.
const CPU_ENV: &str = "COREWISE_DAEMON_TEST_CPU";
const PREFIX: &str = "corewise-rt-test-";
/// The socket and the cgroup root, for the `daemon` child.
const SOCKET_ENV: &str = "COREWISE_DAEMON_TEST_SOCKET";
const ROOT_ENV: &str = "COREWISE_DAEMON_TEST_ROOT";

static COUNTER: AtomicU32 = AtomicU32::new(0);
/// The daemon tests move the whole process between cgroups: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A duration in the environment variable `var` (in `unit`s), else `default`.
fn env_duration(var: &str, unit: Duration, default: Duration) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(default, |n| unit * n)
}

/// How long a wait may last before the test fails.
fn wait_limit() -> Duration {
    env_duration(
        "COREWISE_TEST_WAIT_S",
        Duration::from_secs(1),
        Duration::from_secs(30),
    )
}

/// Whether the cpuset hierarchy is cgroup v2 (`None`: there is none).
fn v2() -> Option<bool> {
    if Path::new(CPUSET).join("tasks").exists() {
        return Some(false);
    }
    std::fs::read_to_string(Path::new(V2_ROOT).join("cgroup.subtree_control"))
        .ok()?
        .split_whitespace()
        .any(|c| c == "cpuset")
        .then_some(true)
}

fn base() -> &'static Path {
    Path::new(if v2() == Some(true) { V2_ROOT } else { CPUSET })
}

/// The file listing a cgroup's threads.
fn threads_file() -> &'static str {
    if v2() == Some(true) {
        "cgroup.threads"
    } else {
        "tasks"
    }
}

/// The daemon's two CPUs: 0 and the first CPU that is not its sibling.
fn two_cpus() -> corewise_arbiter::topology::CpuList {
    let all = corewise_arbiter::topology::online_cpus();
    let topo = corewise_arbiter::topology::Topology::read(&all);
    let other = all
        .cores()
        .find(|&c| c != 0 && !topo.are_siblings(0, c))
        .unwrap_or(1);
    [0, other as usize].into_iter().collect()
}

fn can_run() -> bool {
    let ok = rustix::process::geteuid().is_root()
        && v2().is_some()
        && std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2;
    if !ok {
        eprintln!(
            "skipping: needs root, 2 CPUs and a cpuset hierarchy (cgroup v1 at {CPUSET} or v2 \
             at {V2_ROOT} with cpuset enabled)"
        );
    }
    ok
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + wait_limit();
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn read_ids(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn cpu() -> usize {
    rustix::thread::sched_getcpu()
}

// ------------------------------------------------------------------ guards

/// A cpuset subtree holding this process, and a scratch directory; on drop
/// the process goes back to the root cpuset and both are removed.
struct Sandbox {
    cg: PathBuf,
    dir: PathBuf,
}

fn remove_tree(cg: &Path) {
    let root = base();
    if let Ok(rd) = std::fs::read_dir(cg) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                remove_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while cg.exists() && std::fs::remove_dir(cg).is_err() && Instant::now() < deadline {
        for tid in read_ids(&cg.join(threads_file())) {
            let _ = std::fs::write(root.join("cgroup.procs"), tid.to_string());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Sandbox {
    fn new() -> Self {
        // Subtrees of killed runs (their process is gone) go first.
        if let Ok(rd) = std::fs::read_dir(base()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name.strip_prefix(PREFIX).and_then(|r| r.split('-').next());
                if let Some(pid) = pid {
                    if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                        remove_tree(&e.path());
                    }
                }
            }
        }
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("{PREFIX}{}-{n}", std::process::id());
        let cg = base().join(&name);
        std::fs::create_dir(&cg).expect("mkdir test cpuset");
        let sb = Self {
            cg,
            dir: std::env::temp_dir().join(&name),
        };
        // A new v1 cpuset starts empty; a v2 one inherits its parent's.
        if v2() == Some(false) {
            for f in ["cpuset.mems", "cpuset.cpus"] {
                let v = std::fs::read_to_string(base().join(f)).unwrap();
                std::fs::write(sb.cg.join(f), v.trim()).unwrap();
            }
        }
        std::fs::create_dir_all(&sb.dir).unwrap();
        std::fs::write(sb.cg.join("cgroup.procs"), std::process::id().to_string())
            .expect("move the test process into its cpuset");
        sb
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("arbiter.sock")
    }

    /// The managed cores (one cpuset each, made by the daemon).
    fn managed(&self) -> Vec<usize> {
        let mut v: Vec<usize> = std::fs::read_dir(&self.cg)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix("corewise-core")?
                            .parse()
                            .ok()
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    fn core_tasks(&self, c: usize) -> Vec<u32> {
        read_ids(
            &self
                .cg
                .join(format!("corewise-core{c}"))
                .join(threads_file()),
        )
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::write(base().join("cgroup.procs"), std::process::id().to_string());
        remove_tree(&self.cg);
        if self.cg.exists() {
            eprintln!("warning: could not remove {}", self.cg.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon's settings for a sandbox's socket and cgroup subtree.
fn daemon_options(socket: PathBuf, cgroup_root: PathBuf) -> Options {
    Options {
        socket,
        backend: if v2() == Some(true) {
            Backend::CgroupV2
        } else {
            Backend::CgroupV1
        },
        cgroup_root: Some(cgroup_root),
        cpus: Some(two_cpus()),
        unmanaged: 1,
        reclaim_timeout: env_duration(
            "COREWISE_TEST_RECLAIM_MS",
            Duration::from_millis(1),
            Duration::from_millis(10),
        ),
        config: corewise_arbiter::config::Config {
            socket: corewise_arbiter::config::SocketConfig {
                mode: Some(0o600),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Options::default()
    }
}

/// The daemon, on a thread of this process; stopped on drop.
fn start_daemon(sb: &Sandbox) -> DaemonHandle {
    daemon::spawn(daemon_options(sb.socket(), sb.cg.clone())).expect("start the core arbiter")
}

/// The daemon as a process of its own (this test binary in `daemon`
/// mode), so that it can be killed with SIGKILL; returns once it answers.
fn start_daemon_process(sb: &Sandbox) -> KillOnDrop {
    let child = spawn_child(
        "daemon",
        &[
            (SOCKET_ENV, sb.socket().display().to_string()),
            (ROOT_ENV, sb.cg.display().to_string()),
        ],
    );
    let sock = sb.socket();
    wait_until("the daemon process answers", || {
        corewise_arbiter::client::status(&sock).is_ok()
    });
    child
}

/// A child process, killed on drop (even when a test fails).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(mode: &str, envs: &[(&str, String)]) -> KillOnDrop {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .env_remove(ARBITER_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    KillOnDrop(cmd.spawn().expect("spawn child"))
}

/// The child's next report line (behind the `@@ ` marker).
fn next_report(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    for l in lines {
        let l = l.expect("child stdout");
        if let Some((_, msg)) = l.split_once("@@ ") {
            return msg.to_string();
        }
    }
    panic!("child ended without reporting");
}

// -------------------------------------------------------------- child side

/// Entry point of the re-executed child; a no-op in the normal test run.
#[test]
fn child_entry() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    match mode.as_str() {
        "high" => child_high(),
        "env-fallback" => child_env_fallback(),
        "daemon" => {
            let socket = PathBuf::from(std::env::var(SOCKET_ENV).unwrap());
            let root = PathBuf::from(std::env::var(ROOT_ENV).unwrap());
            daemon::run(daemon_options(socket, root)).expect("daemon");
        }
        other => panic!("unknown child mode {other}"),
    }
    std::process::exit(0);
}

fn say(line: String) {
    let out = std::io::stdout();
    let mut l = out.lock();
    let _ = writeln!(l, "\n@@ {line}");
    let _ = l.flush();
}

/// A priority-0 application that picks the daemon from `COREWISE_ARBITER`,
/// takes the managed core, reports where its threads ran, and holds the
/// core until told to exit.
fn child_high() {
    let managed: usize = std::env::var(CPU_ENV).unwrap().parse().unwrap();
    let rt = Runtime::builder().priority(0).build().unwrap();
    assert_eq!(rt.arbiter_kind(), ArbiterKind::Daemon);
    wait_until("the child holds the managed core", || only_on(&rt, managed));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            rt.spawn(|| {
                let mut seen = Vec::new();
                for _ in 0..100 {
                    seen.push(cpu());
                    corewise::yield_now();
                }
                seen
            })
            .unwrap()
        })
        .collect();
    let mut cpus: Vec<usize> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    cpus.sort_unstable();
    cpus.dedup();
    say(format!(
        "held {managed} ran-on {}",
        cpus.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    ));
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(rt);
    say("done".into());
}

/// `COREWISE_ARBITER` names a socket nobody listens on: the runtime must
/// fall back to the in-process arbiter with exactly one warning.
fn child_env_fallback() {
    let (sub, log) = capture();
    let rt = tracing::subscriber::with_default(sub, || Runtime::builder().build().unwrap());
    let v = rt.block_on(|| 6 * 7).unwrap();
    say(format!(
        "kind {:?} value {v} warnings {}",
        rt.arbiter_kind(),
        warnings(&log)
    ));
}

/// A tracing subscriber writing into a buffer.
fn capture() -> (impl tracing::Subscriber + Send + Sync, Arc<Mutex<Vec<u8>>>) {
    #[derive(Clone)]
    struct W(Arc<Mutex<Vec<u8>>>);
    impl Write for W {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let w = W(buf.clone());
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || w.clone())
        .finish();
    (sub, buf)
}

/// Warnings about the arbiter (other subsystems may warn about the
/// machine, e.g. an old kernel's io_uring).
fn warnings(log: &Mutex<Vec<u8>>) -> usize {
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains("WARN") && l.contains("corewise::arbiter"))
        .count()
}

// ------------------------------------------------------------- parent side

/// Whether the runtime's only active core is on `cpu` (the floor has
/// stepped back).
fn only_on(rt: &Runtime, cpu: usize) -> bool {
    // Core 0 is the floor, which runs unconfined (possibly on `cpu` too,
    // before the daemon took `cpu` out of its unmanaged set).
    let active: Vec<_> = rt.core_stats().into_iter().filter(|c| c.active).collect();
    active.len() == 1 && active[0].core != 0 && active[0].cpu == cpu
}

/// Whether some active core of the runtime is on `cpu`.
fn holds(rt: &Runtime, cpu: usize) -> bool {
    rt.core_stats()
        .iter()
        .any(|c| c.active && c.core != 0 && c.cpu == cpu)
}

/// User threads that work (and sleep a little) until `stop`, counting
/// rounds; they return the rounds done.
struct Workload {
    stop: Arc<AtomicBool>,
    rounds: Arc<Vec<AtomicU64>>,
    handles: Vec<corewise::JoinHandle<u64>>,
}

impl Workload {
    fn start(rt: &Runtime, n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let handles = (0..n)
            .map(|i| {
                let (stop, rounds) = (stop.clone(), rounds.clone());
                rt.spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for j in 0..2000u64 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(j));
                        }
                        rounds[i].fetch_add(1, Ordering::Relaxed);
                        corewise::sleep(Duration::from_micros(200));
                    }
                    rounds[i].load(Ordering::Relaxed)
                })
                .unwrap()
            })
            .collect();
        Self {
            stop,
            rounds,
            handles,
        }
    }

    fn snapshot(&self) -> Vec<u64> {
        self.rounds
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .collect()
    }

    /// Waits until every thread has done more rounds than in `before`.
    fn wait_progress(&self, what: &str) {
        let before = self.snapshot();
        wait_until(what, || {
            self.snapshot()
                .iter()
                .zip(&before)
                .all(|(now, then)| now > then)
        });
    }

    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.handles)
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    }
}

impl Drop for Workload {
    /// A failed test still lets the runtime shut down: the threads stop.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A runtime of the daemon on `sb`, once it holds the managed core (which
/// is returned too).
fn runtime_on_the_core(sb: &Sandbox) -> (Runtime, usize) {
    let core = sb.managed()[0];
    let rt = Runtime::builder()
        .arbiter_socket(sb.socket())
        .build()
        .unwrap();
    wait_until("the runtime holds the managed core", || only_on(&rt, core));
    (rt, core)
}

/// A runtime of the daemon on `sb`, holding the managed core, with 4
/// threads at work.
fn runtime_at_work(sb: &Sandbox) -> (Runtime, Workload) {
    let (rt, _) = runtime_on_the_core(sb);
    let work = Workload::start(&rt, 4);
    work.wait_progress("threads run");
    (rt, work)
}

/// (a) With the daemon, the runtime gets the managed core and its threads
/// run on it.
#[test]
fn runtime_runs_on_the_granted_core() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let _daemon = start_daemon(&sb);
    let managed = sb.managed();
    assert_eq!(managed.len(), 1, "2 CPUs, one unmanaged: {managed:?}");
    let core = managed[0];
    let rt = Runtime::builder()
        .arbiter_socket(sb.socket())
        .priority(3)
        .build()
        .unwrap();
    assert_eq!(rt.arbiter_kind(), ArbiterKind::Daemon);
    wait_until("the runtime holds the managed core", || only_on(&rt, core));
    // The kernel's view: the core's cpuset holds a thread of this process.
    let tasks = sb.core_tasks(core);
    assert!(!tasks.is_empty(), "no thread in the core's cpuset");
    for t in &tasks {
        assert!(
            Path::new(&format!("/proc/self/task/{t}")).exists(),
            "foreign thread {t} on the granted core"
        );
    }
    // The daemon's view.
    let status = corewise_arbiter::client::status(sb.socket()).unwrap();
    let me = status
        .iter()
        .find(|e| e.pid == std::process::id())
        .expect("registered with the daemon");
    assert_eq!(me.granted, vec![core as u32]);
    assert_eq!(
        me.requested[3], 1,
        "request at priority 3: {:?}",
        me.requested
    );
    // Where the user threads run.
    let hs: Vec<_> = (0..8)
        .map(|_| {
            rt.spawn(|| {
                (0..200)
                    .map(|_| {
                        let c = cpu();
                        corewise::yield_now();
                        c
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap()
        })
        .collect();
    for h in hs {
        for c in h.join().unwrap() {
            assert_eq!(c, core, "a user thread ran off the granted core");
        }
    }
    drop(rt);
    // The runtime's sockets are closed: the daemon has taken the core back.
    wait_until("the core is free again", || {
        corewise_arbiter::client::status(sb.socket())
            .map(|s| s.iter().all(|e| e.granted.is_empty()))
            .unwrap_or(false)
    });
}

/// (b) A higher-priority application (another process) takes the managed
/// core; the lower one keeps running on what is left, and gets the core
/// back when the other one is done.
#[test]
fn higher_priority_application_takes_the_core() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let _daemon = start_daemon(&sb);
    let core = sb.managed()[0];
    let rt = Runtime::builder()
        .arbiter_socket(sb.socket())
        .priority(5)
        .build()
        .unwrap();
    wait_until("the low application holds the core", || only_on(&rt, core));
    let work = Workload::start(&rt, 4);
    work.wait_progress("the low application's threads run");

    let mut child = spawn_child(
        "high",
        &[
            (ARBITER_ENV, sb.socket().display().to_string()),
            (CPU_ENV, core.to_string()),
        ],
    );
    let out = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let report = next_report(&mut lines);
    assert_eq!(
        report,
        format!("held {core} ran-on {core}"),
        "the high-priority application's threads run on the core it took"
    );
    // While the child holds the core, the low application has given it up
    // (its dispatcher may notice a forced reclaim a little later) and still
    // runs, in the unmanaged set.
    wait_until("the low application gives the core up", || {
        !holds(&rt, core)
    });
    work.wait_progress("the low application's threads still make progress");
    let probe = rt.block_on(cpu).unwrap();
    assert_ne!(probe, core, "the low application ran on the taken core");

    writeln!(child.0.stdin.as_mut().unwrap(), "exit").unwrap();
    assert_eq!(next_report(&mut lines), "done");
    assert!(child.0.wait().unwrap().success());
    // The core comes back, and the work finishes.
    wait_until("the low application gets the core back", || {
        holds(&rt, core)
    });
    work.wait_progress("the threads run on the returned core");
    let rounds = work.finish();
    assert!(rounds.iter().all(|&r| r > 0), "{rounds:?}");
}

/// (c) The daemon stops while the application runs: nothing is lost, the
/// held core stays, and new threads still run.
#[test]
fn daemon_stopped_mid_run_leaves_the_application_running() {
    let _g = serial();
    if !can_run() {
        return;
    }
    let sb = Sandbox::new();
    let daemon = start_daemon(&sb);
    let (rt, work) = runtime_at_work(&sb);

    daemon.stop().expect("daemon stops cleanly");

    work.wait_progress("threads still run without the daemon");
    // A dispatcher that notices the loss leaves the daemon's set and takes
    // its core again on the budget: a moment with no core held is allowed.
    wait_until("a core held without the daemon", || rt.active_cores() >= 1);
    let hs: Vec<_> = (0..16).map(|i| rt.spawn(move || i * 2).unwrap()).collect();
    let sum: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, (0..16).map(|i| i * 2).sum::<u64>());
    let rounds = work.finish();
    assert_eq!(rounds.len(), 4);
    assert!(rounds.iter().all(|&r| r > 0), "{rounds:?}");
    // Shutting the runtime down does not wait for a daemon that is gone.
    drop(rt);
}

/// The Linux thread ids of this process.
fn my_threads() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A file of one of this process's threads in `/proc` ("" once it is gone).
fn task_file(tid: u32, file: &str) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/{file}")).unwrap_or_default()
}

/// A thread's allowed CPUs, as the kernel lists them.
fn allowed_cpus(tid: u32) -> String {
    task_file(tid, "status")
        .lines()
        .find_map(|l| {
            l.strip_prefix("Cpus_allowed_list:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// (e) The daemon is killed (SIGKILL) while the runtime holds its core:
/// the runtime notices, its kernel threads leave the dead daemon's cpusets
/// for its budget and keep running, and once a new daemon is up the
/// runtime registers again and gets the core again.
#[test]
fn daemon_killed_runtime_runs_on_and_reconnects() {
    let _g = serial();
    if !can_run() {
        return;
    }
    // The runtime's kernel threads log from threads of their own: only a
    // process-wide subscriber sees them (no other test sets one).
    let (sub, log) = capture();
    let global = tracing::subscriber::set_global_default(sub).is_ok();
    let sb = Sandbox::new();
    let mut first = start_daemon_process(&sb);
    let core = sb.managed()[0];
    let (rt, work) = runtime_at_work(&sb);
    let mine = |tids: Vec<u32>| -> Vec<u32> {
        let me = my_threads();
        tids.into_iter().filter(|t| me.contains(t)).collect()
    };
    let holder = mine(sb.core_tasks(core));
    assert_eq!(holder.len(), 1, "one kernel thread of ours on the core");

    first.0.kill().unwrap();
    first.0.wait().unwrap();
    // The dead daemon's core set is left behind; our thread is not in it.
    assert!(sb.cg.join(format!("corewise-core{core}")).exists());
    wait_until("our kernel thread leaves the dead daemon's core", || {
        mine(sb.core_tasks(core)).is_empty()
    });
    // It went to the daemon's root, with the budget's CPUs (with a daemon,
    // the runtime's CPUs are the online ones).
    let root_threads = read_ids(&sb.cg.join(threads_file()));
    assert!(
        root_threads.contains(&holder[0]),
        "the holder is in the daemon's root ({root_threads:?})"
    );
    let budget = corewise_arbiter::topology::online_cpus().to_string();
    assert_eq!(allowed_cpus(holder[0]), budget, "confined no more");
    work.wait_progress("threads run without the daemon");
    let hs: Vec<_> = (0..8).map(|i| rt.spawn(move || i + 1).unwrap()).collect();
    assert_eq!(hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>(), 36);

    // A new daemon: the runtime registers again and gets the core back.
    let _second = start_daemon_process(&sb);
    wait_until("the runtime registers with the new daemon", || {
        corewise_arbiter::client::status(sb.socket()).is_ok_and(|s| {
            s.iter()
                .any(|e| e.pid == std::process::id() && e.granted == vec![core as u32])
        })
    });
    wait_until("the runtime holds the core again", || only_on(&rt, core));
    // The runtime may count the core as held a moment before the daemon
    // has moved the thread in.
    wait_until("one kernel thread of ours on the core", || {
        mine(sb.core_tasks(core)).len() == 1
    });
    let on_core = mine(sb.core_tasks(core));
    assert_eq!(on_core.len(), 1, "one kernel thread of ours on the core");
    assert_eq!(allowed_cpus(on_core[0]), core.to_string());
    work.wait_progress("threads run on the core again");
    let rounds = work.finish();
    assert!(rounds.iter().all(|&r| r > 0), "{rounds:?}");
    drop(rt);
    if global {
        let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
        assert_eq!(warnings(&log), 1, "the loss is said once:\n{text}");
        assert!(text.contains("daemon lost"), "{text}");
        assert!(text.contains("registered again"), "{text}");
    }
}

/// A thread's name (`comm`), or "" once it is gone.
fn comm(tid: u32) -> String {
    task_file(tid, "comm").trim().to_string()
}

/// (f) Blocking handoff under the daemon: a user thread blocks in
/// `std::thread::sleep` on the granted core beside a ticker. The core goes
/// to a spare kernel thread, which the daemon puts in the core's cpuset
/// (and takes the blocked one out), so the ticker keeps ticking on the
/// granted CPU and only threads of this process are ever in that cpuset.
#[test]
fn a_blocked_kernel_thread_hands_the_daemon_core_to_a_spare() {
    let _g = serial();
    if !can_run() {
        return;
    }
    const TICK: Duration = Duration::from_millis(10);
    let sb = Sandbox::new();
    let _daemon = start_daemon(&sb);
    let (rt, core) = runtime_on_the_core(&sb);
    let first = sb.core_tasks(core);
    assert_eq!(first.len(), 1, "one kernel thread on the core: {first:?}");
    // The core's kernel thread is named after its core index.
    let name = comm(first[0]);
    assert!(name.starts_with("corewise-core-"), "{name}");

    // Watches the core's cpuset from outside the runtime.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, cg) = (stop.clone(), sb.cg.join(format!("corewise-core{core}")));
        std::thread::spawn(move || {
            let mut seen: Vec<(Vec<u32>, Vec<String>)> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let tasks = read_ids(&cg.join(threads_file()));
                let names = tasks.iter().map(|&t| comm(t)).collect();
                if seen.last().is_none_or(|l| l.0 != tasks) {
                    seen.push((tasks, names));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        })
    };
    let (ticks, expected, cpus) = rt
        .block_on(move || {
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let ticker = corewise::spawn(move || {
                let start = Instant::now();
                let (mut ticks, mut cpus) = (0u32, vec![cpu()]);
                while !d.load(Ordering::Acquire) {
                    corewise::sleep(TICK);
                    ticks += 1;
                    cpus.push(cpu());
                }
                (ticks, start.elapsed(), cpus)
            })
            .unwrap();
            corewise::sleep(Duration::from_millis(5));
            let blocker = corewise::spawn(|| {
                let on = cpu();
                std::thread::sleep(Duration::from_millis(300));
                on
            })
            .unwrap();
            let blocked_on = blocker.join().unwrap();
            done.store(true, Ordering::Release);
            let (ticks, elapsed, mut cpus) = ticker.join().unwrap();
            cpus.push(blocked_on);
            (ticks, (elapsed.as_micros() / TICK.as_micros()) as u32, cpus)
        })
        .unwrap();
    stop.store(true, Ordering::Release);
    let seen = watcher.join().unwrap();
    // Without a handoff the ticker runs about once in the 300 ms. Half
    // its ticks, not the 80 % that tests/handoff.rs asks of the in-process
    // arbiter: here each handoff also waits for the daemon's cgroup writes,
    // which take milliseconds in the emulated guest this test runs in too.
    assert!(
        ticks * 2 >= expected,
        "the ticker ran {ticks} times of about {expected}"
    );
    assert!(
        cpus.iter().all(|&c| c == core),
        "the ticker and the blocker ran on the granted CPU {core}: {cpus:?}"
    );
    assert!(rt.stats().handoffs >= 1, "no handoff counted");
    // Only this process's threads were ever in the core's cpuset, and a
    // spare owned the core there alone while the first one was blocked.
    let me = std::process::id();
    for (tasks, _) in &seen {
        for t in tasks {
            assert!(
                Path::new(&format!("/proc/{me}/task/{t}")).exists()
                    || !Path::new(&format!("/proc/{t}")).exists(),
                "thread {t} of another process in the core's cpuset: {seen:?}"
            );
        }
    }
    assert!(
        seen.iter()
            .any(|(tasks, names)| tasks.len() == 1 && tasks[0] != first[0] && names[0] == name),
        "no spare alone in the core's cpuset: {seen:?} (first owner {first:?})"
    );
    drop(rt);
}

/// (d) An unreachable socket. Asked for by name, it fails the build with a
/// typed error and no fallback; with the explicit fallback (or from
/// `COREWISE_ARBITER`) the runtime says so once and runs with the
/// in-process arbiter.
#[test]
fn unreachable_daemon_fails_or_falls_back_with_one_warning() {
    // Serialised with the tests that move this process into a cgroup
    // subtree: a child spawned meanwhile would inherit that cgroup.
    let _g = serial();
    let sock = std::env::temp_dir().join(format!(
        "corewise-no-daemon-{}-{}.sock",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let (sub, log) = capture();
    let strict = tracing::subscriber::with_default(sub, || {
        Runtime::builder()
            .arbiter_socket(sock.clone())
            .build()
            .map(|_| ())
    });
    match strict {
        Err(e @ corewise::BuildError::ArbiterUnreachable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&sock.display().to_string()), "{msg}");
            assert!(msg.contains("arbiter_socket_or_local"), "{msg}");
        }
        other => panic!("expected ArbiterUnreachable, got {other:?}"),
    }
    assert_eq!(warnings(&log), 0, "a failed build does not also warn");

    let (sub, log) = capture();
    let rt = tracing::subscriber::with_default(sub, || {
        Runtime::builder()
            .arbiter(ArbiterChoice::DaemonOrLocal(sock.clone()))
            .build()
            .unwrap()
    });
    assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
    assert_eq!(rt.block_on(|| 6 * 7).unwrap(), 42);
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert_eq!(warnings(&log), 1, "{text}");
    assert!(text.contains("unreachable"), "{text}");
    drop(rt);

    let mut child = spawn_child("env-fallback", &[(ARBITER_ENV, sock.display().to_string())]);
    let out = child.0.stdout.take().unwrap();
    let report = next_report(&mut BufReader::new(out).lines());
    assert_eq!(report, "kind Local value 42 warnings 1");
    assert!(child.0.wait().unwrap().success());
}

/// Not a test: the CPU an idle runtime costs with each arbiter (the
/// daemon's bounded idle sleep). `cargo test -p corewise --test daemon --
/// --ignored --nocapture idle_cpu_cost`.
#[test]
#[ignore = "a measurement; prints numbers"]
fn idle_cpu_cost() {
    let _g = serial();
    if !can_run() {
        return;
    }
    fn cpu_time() -> Duration {
        let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the rusage it is given; RUSAGE_SELF is valid.
        let ru = unsafe {
            libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
            ru.assume_init()
        };
        let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
        t(ru.ru_utime) + t(ru.ru_stime)
    }
    let measure = |rt: &Runtime| {
        std::thread::sleep(Duration::from_millis(500));
        let (c0, t0) = (cpu_time(), Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        cpu_time().saturating_sub(c0).as_secs_f64() / t0.elapsed().as_secs_f64() * 100.0
            + 0.0 * rt.cores() as f64
    };
    let local = Runtime::builder()
        .arbiter(ArbiterChoice::Local)
        .build()
        .unwrap();
    let l = measure(&local);
    drop(local);
    let sb = Sandbox::new();
    let _daemon = start_daemon(&sb);
    let (rt, _) = runtime_on_the_core(&sb);
    let d = measure(&rt);
    println!("idle runtime CPU: local {l:.3} %, daemon (2 ms release poll) {d:.3} % of one CPU");
}

/// (f) On a machine with 6 managed CPUs (the guest's 8, one physical core
/// unmanaged), the runtime's core estimation grows from one core to all
/// six under load and shrinks back when the load goes. (The CPU budget
/// must not be read from the daemon's unmanaged set, which shrinks with
/// every grant: the runtime would stop growing at what is left of it.)
#[test]
fn estimation_grows_to_six_daemon_cores_and_back() {
    let _g = serial();
    if !can_run() {
        return;
    }
    if corewise_arbiter::topology::online_cpus().len() < 8 {
        eprintln!("skipping: needs 8 CPUs (scripts/guest.sh)");
        return;
    }
    let sb = Sandbox::new();
    let _daemon = daemon::spawn(Options {
        cpus: None,
        ..daemon_options(sb.socket(), sb.cg.clone())
    })
    .expect("start the core arbiter");
    let mut managed = sb.managed();
    managed.sort_unstable();
    assert_eq!(managed.len(), 6, "{managed:?}");
    let rt = Runtime::builder()
        .arbiter_socket(sb.socket())
        .build()
        .unwrap();
    let granted = || {
        corewise_arbiter::client::status(sb.socket())
            .ok()
            .and_then(|s| s.into_iter().find(|e| e.pid == std::process::id()))
            .map_or(0, |e| e.granted.len())
    };
    wait_until("one core while idle", || granted() <= 1);
    /// Stops the load even when an assertion fails, so the runtime can
    /// shut down.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let hs: Vec<_> = (0..24)
        .map(|_| {
            let stop = stop.clone();
            rt.spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for j in 0..20_000u64 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(j));
                    }
                    corewise::yield_now();
                }
                x
            })
            .unwrap()
        })
        .collect();
    wait_until("six daemon cores under load", || granted() == 6);
    wait_until("the runtime's active cores are the managed CPUs", || {
        let mut on: Vec<usize> = rt
            .core_stats()
            .into_iter()
            .filter(|c| c.active && c.core != 0)
            .map(|c| c.cpu)
            .collect();
        on.sort_unstable();
        on == managed
    });
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    wait_until("back to at most one core when idle", || granted() <= 1);
    drop(rt);
}
