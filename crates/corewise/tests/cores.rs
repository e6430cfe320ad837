//! Core awareness: the runtime scales its cores with load, gives cores back
//! without losing threads, and stays inside its CPU budget.

use corewise::sync::{channel, Semaphore};
use corewise::thread::Builder;
use corewise::{PolicyConfig, Runtime};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn scales_up_under_load_and_back_down_when_idle() {
    let rt = Runtime::builder()
        .neighbour_awareness(None)
        .policy_config(PolicyConfig {
            window: Duration::from_millis(20),
            ..PolicyConfig::default()
        })
        .build()
        .unwrap();
    if rt.cores() < 2 {
        return;
    }
    // Idle: one core.
    wait_for("one core when idle", Duration::from_secs(10), || {
        rt.active_cores() == 1
    });
    // Many runnable threads: the load factor passes 2.25 and a core is added.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            rt.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(20) {
                        std::hint::spin_loop();
                    }
                    corewise::yield_now();
                }
            })
            .unwrap()
        })
        .collect();
    wait_for("a second core under load", Duration::from_secs(10), || {
        rt.active_cores() == 2
    });
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    wait_for(
        "back to one core when idle",
        Duration::from_secs(10),
        || rt.active_cores() == 1,
    );
}

#[test]
fn a_released_core_loses_none_of_its_threads() {
    let rt = Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    if rt.cores() < 2 {
        return;
    }
    let (tx, rx) = channel::<u32>(1);
    let gate = Arc::new(Semaphore::new(0));
    let on_core1 = |b: Builder| b.core(1);
    // Each thread counts itself here just before it blocks: the core goes
    // only once all four are on it (a slow machine took longer than a fixed
    // pause to start them, and the joiner's spawn onto core 1 then failed
    // with CoreUnavailable, as it should on a released core).
    let ready = Arc::new(AtomicUsize::new(0));
    // Blocked in a channel.
    let r = ready.clone();
    let blocked = on_core1(Builder::new())
        .spawn_in(&rt, move || {
            r.fetch_add(1, Ordering::SeqCst);
            let v = rx.recv().unwrap();
            (v, corewise::current_core().unwrap())
        })
        .unwrap();
    // Sleeping with a deadline.
    let r = ready.clone();
    let sleeper = on_core1(Builder::new())
        .spawn_in(&rt, move || {
            r.fetch_add(1, Ordering::SeqCst);
            let t = Instant::now();
            corewise::sleep(Duration::from_millis(150));
            (t.elapsed(), corewise::current_core().unwrap())
        })
        .unwrap();
    // Joining a child that waits on a semaphore.
    let g = gate.clone();
    let r = ready.clone();
    let joiner = on_core1(Builder::new())
        .spawn_in(&rt, move || {
            let r2 = r.clone();
            let child = Builder::new()
                .core(1)
                .spawn(move || {
                    r2.fetch_add(1, Ordering::SeqCst);
                    g.acquire();
                    41
                })
                .unwrap();
            r.fetch_add(1, Ordering::SeqCst);
            (child.join().unwrap() + 1, corewise::current_core().unwrap())
        })
        .unwrap();
    wait_for(
        "four threads about to block on core 1",
        Duration::from_secs(10),
        || ready.load(Ordering::SeqCst) == 4,
    );
    rt.set_max_cores(1);
    // The core stops taking threads first (inactive), then hands its own
    // over: every one of them must leave it.
    wait_for(
        "core 1 released, no thread left on it",
        Duration::from_secs(10),
        || {
            let c = &rt.core_stats()[1];
            rt.active_cores() == 1 && !c.active && c.threads == 0 && c.queued == 0
        },
    );
    tx.send(7).unwrap();
    gate.release();
    assert_eq!(blocked.join().unwrap(), (7, 0));
    let (slept, core) = sleeper.join().unwrap();
    assert!(slept >= Duration::from_millis(150));
    assert_eq!(core, 0);
    assert_eq!(joiner.join().unwrap(), (42, 0));
    // The limit lifted, the core comes back and takes threads again.
    rt.set_max_cores(usize::MAX);
    wait_for("core 1 granted again", Duration::from_secs(10), || {
        rt.active_cores() == 2
    });
    let c = Builder::new()
        .core(1)
        .spawn_in(&rt, || corewise::current_core().unwrap())
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(c, 1);
}

#[test]
fn an_idle_runtime_holds_one_core() {
    let rt = Runtime::builder().build().unwrap();
    rt.spawn(|| ()).unwrap().join().unwrap();
    wait_for("one core", Duration::from_secs(10), || {
        rt.active_cores() == 1
    });
}

/// Runs inside a cgroup whose quota is one CPU: the runtime must not hold
/// more than one core even when asked for two and loaded.
#[test]
fn quota_child() {
    let Some(procs) = std::env::var_os("COREWISE_QUOTA_CHILD") else {
        return;
    };
    // Move into the cgroup before the runtime (and its threads) exist.
    std::fs::write(&procs, std::process::id().to_string()).unwrap();
    let rt = Runtime::builder().min_cores(2).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            rt.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    corewise::yield_now();
                }
            })
            .unwrap()
        })
        .collect();
    let mut most = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        most = most.max(rt.active_cores());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    println!("MOST_ACTIVE_CORES={most}");
}

/// A cgroup v1 `cpu` directory of this test's own, removed on drop (tasks
/// moved back to the root first).
struct CpuCgroup(std::path::PathBuf);

impl CpuCgroup {
    fn new(name: &str) -> Option<Self> {
        let root = std::path::Path::new("/sys/fs/cgroup/cpu");
        if !root.join("cpu.cfs_quota_us").exists() {
            return None;
        }
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Self(dir))
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        let root = self.0.parent().unwrap().join("cgroup.procs");
        if let Ok(tasks) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in tasks.split_whitespace() {
                let _ = std::fs::write(&root, pid);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_one_cpu_quota_keeps_the_runtime_on_one_core() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return;
    }
    let Some(cg) = CpuCgroup::new("corewise-cores-test") else {
        eprintln!("no writable cgroup v1 cpu hierarchy; skipped");
        return;
    };
    std::fs::write(cg.0.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(cg.0.join("cpu.cfs_quota_us"), "100000").unwrap();
    let exe = std::env::current_exe().unwrap();
    // The child moves itself into the cgroup before it starts the runtime.
    let out = std::process::Command::new(exe)
        .args(["--exact", "quota_child", "--nocapture", "--test-threads=1"])
        .env("COREWISE_QUOTA_CHILD", cg.0.join("cgroup.procs"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The harness prints "test quota_child ... " on the same line.
    let most: usize = stdout
        .split("MOST_ACTIVE_CORES=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("child reported its cores");
    assert_eq!(most, 1, "a 1-CPU quota must keep the runtime on one core");
    drop(cg);
}

/// A core whose 56 slots are all occupied by runnable threads still ends
/// its rotations: it accounts load and notices that it must give the core
/// back (the scan once reset to slot 0 after slot 55, which hid the wrap).
#[test]
fn a_core_with_every_slot_full_still_releases() {
    let rt = Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    if rt.cores() < 2 {
        return;
    }
    wait_for("two cores", Duration::from_secs(10), || {
        rt.active_cores() == 2
    });
    let stop = Arc::new(AtomicBool::new(false));
    // Fill every slot of core 1 with threads that are always runnable (core
    // 0 stays free to take them when core 1 goes).
    let mut workers = Vec::new();
    for _ in 0..56 {
        let stop = stop.clone();
        workers.push(
            Builder::new()
                .core(1)
                .spawn_in(&rt, move || {
                    while !stop.load(Ordering::Relaxed) {
                        corewise::yield_now();
                    }
                })
                .unwrap(),
        );
    }
    let full = rt.core_stats()[1].threads;
    assert!(full >= 56, "core 1 holds {full} threads");
    rt.set_max_cores(1);
    wait_for(
        "the full core to give itself back",
        Duration::from_secs(20),
        || rt.active_cores() == 1,
    );
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
}

/// A core whose 56 slots are full of threads that compute for 50 ms between
/// switches needs 2.8 s for one rotation of its slots; asked for fewer
/// cores, the runtime has the busy core look between two runs, not at the
/// end of a rotation, so it goes within a run or two. (Looking at the end
/// of rotations only, it went 2.8 s after the limit: the threads start
/// together, so the first rotation had just begun, and about 55 more runs
/// started there.) Counted in runs, not timed: each thread counts the
/// runs it starts on core 1 once the limit is set.
#[test]
fn a_busy_core_is_released_between_two_runs() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let rt = Runtime::builder()
        .min_cores(2)
        .max_cores(2)
        .neighbour_awareness(None)
        .blocking_handoff(false)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Dropped before the runtime: a failed wait stops the spinners, so the
    // failure is reported instead of the runtime's drop waiting forever.
    let _stop_on_unwind = StopOnDrop(stop.clone());
    // Set just before the limit; then the runs started on core 1.
    let limited = Arc::new(AtomicBool::new(false));
    let late_runs = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..112)
        .map(|i| {
            let stop = stop.clone();
            let (limited, late_runs) = (limited.clone(), late_runs.clone());
            Builder::new()
                .core(i % 2)
                .spawn_in(&rt, move || {
                    while !stop.load(Ordering::Relaxed) {
                        if limited.load(Ordering::SeqCst) && corewise::current_core() == Some(1) {
                            late_runs.fetch_add(1, Ordering::SeqCst);
                        }
                        let t = Instant::now();
                        while t.elapsed() < Duration::from_millis(50)
                            && !stop.load(Ordering::Relaxed)
                        {
                            std::hint::spin_loop();
                        }
                        corewise::yield_now();
                    }
                })
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    // Cores 0 and 1 (a machine with more CPUs lists its other cores too,
    // inactive under max_cores(2)).
    while !rt.core_stats()[..2].iter().all(|c| c.threads >= 50) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for both cores full: {:?}",
            rt.core_stats()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    limited.store(true, Ordering::SeqCst);
    rt.set_max_cores(1);
    wait_for("core 1 released", Duration::from_secs(30), || {
        rt.active_cores() == 1 && !rt.core_stats()[1].active
    });
    let late = late_runs.load(Ordering::SeqCst);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        late <= 3,
        "{late} runs started on core 1 after the limit (one rotation of its slots is 56)"
    );
}
