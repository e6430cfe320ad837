//! User threads on real cores: creation, placement, join, panics, yield,
//! sleep, block/signal, full runtimes, exclusive cores, idle sleep.

use corewise::thread::Builder;
use corewise::{Runtime, SpawnError, ThreadClass};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Both cores held all the time (the tests place threads on core 1).
fn two_core_runtime() -> Runtime {
    Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .expect("runtime")
}

/// One core (CPU 0), neighbour awareness off: a test that depends on the
/// order of runs on one core.
fn one_core_runtime() -> Runtime {
    Runtime::builder()
        .cpus([0])
        .neighbour_awareness(None)
        .build()
        .expect("runtime")
}

#[test]
fn threads_run_on_every_core_and_return_values() {
    let rt = two_core_runtime();
    let hs: Vec<_> = (0..1000u64)
        .map(|i| {
            Builder::new()
                .wait_at_limit(true)
                .spawn_in(&rt, move || (i * 2, corewise::current_core().unwrap()))
                .unwrap()
        })
        .collect();
    let mut seen = vec![0usize; rt.cores()];
    for (i, h) in hs.into_iter().enumerate() {
        let (v, core) = h.join().unwrap();
        assert_eq!(v, i as u64 * 2);
        seen[core] += 1;
    }
    assert!(seen.iter().all(|&n| n > 0), "threads landed on {seen:?}");
    // Each core runs on its own CPU.
    let stats = rt.core_stats();
    let cpus: Vec<usize> = stats.iter().map(|s| s.cpu).collect();
    assert_eq!(cpus, rt.cpus());
}

#[test]
fn a_thread_runs_on_the_cpu_of_its_core() {
    let rt = two_core_runtime();
    for core in 0..rt.cores() {
        let cpu = Builder::new()
            .core(core)
            .spawn_in(&rt, rustix::thread::sched_getcpu)
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(cpu, rt.cpus()[core]);
    }
}

#[test]
fn join_blocks_the_thread_not_the_core() {
    // Parent and child on one core: if join blocked the core, the child
    // could never run.
    let rt = two_core_runtime();
    let v = Builder::new()
        .core(0)
        .spawn_in(&rt, || {
            let child = Builder::new()
                .core(0)
                .spawn(|| {
                    corewise::sleep(Duration::from_millis(5));
                    7
                })
                .unwrap();
            child.join().unwrap() * 6
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(v, 42);
}

#[test]
fn a_panic_comes_back_from_join_and_the_runtime_lives_on() {
    let rt = two_core_runtime();
    let h = rt
        .spawn(|| -> u32 { panic!("deliberate test panic") })
        .unwrap();
    let err = h.join().unwrap_err();
    assert!(err.message.contains("deliberate test panic"));
    // The slot and the core still work.
    for _ in 0..200 {
        assert_eq!(rt.spawn(|| 5).unwrap().join().unwrap(), 5);
    }
}

/// More runnable threads than a core has slots take turns round robin: a
/// thread that yields runs again after about one turn of every other
/// thread (counted in runs, so the machine's speed does not matter), not
/// after the whole queue has gone through one swap per 32 runs.
#[test]
fn threads_beyond_the_slots_take_turns() {
    const N: usize = 300;
    const ROUNDS: usize = 100;
    let rt = one_core_runtime();
    let seq = Arc::new(AtomicUsize::new(0));
    let worst = rt
        .block_on(move || {
            let hs: Vec<_> = (0..N)
                .map(|_| {
                    let seq = seq.clone();
                    corewise::spawn(move || {
                        let (mut last, mut worst) = (None, 0);
                        for _ in 0..ROUNDS {
                            let now = seq.fetch_add(1, Ordering::Relaxed);
                            if let Some(l) = last {
                                worst = usize::max(worst, now - l);
                            }
                            last = Some(now);
                            corewise::yield_now();
                        }
                        worst
                    })
                    .unwrap()
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
        })
        .unwrap();
    assert!(
        worst <= 3 * N,
        "a thread waited {worst} runs of others between two of its own ({N} threads)"
    );
}

/// Threads woken one after another while parked (out of their slots) run
/// in the order they were woken, whatever slots are free: here the slot of
/// a sleeper lies behind the dispatcher's scan, and taking the lowest free
/// slot put the first woken thread there, to run last.
#[test]
fn parked_threads_run_in_the_order_they_were_woken() {
    const N: usize = 20;
    let rt = one_core_runtime();
    let order = rt
        .block_on(|| {
            let order = Arc::new(Mutex::new(Vec::new()));
            let ids = Arc::new(Mutex::new(Vec::new()));
            let woken: Arc<Vec<AtomicBool>> =
                Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
            let stop = Arc::new(AtomicBool::new(false));
            // Takes the first slot, and leaves it when it starts sleeping.
            let sleeper = corewise::spawn(|| corewise::sleep(Duration::from_millis(100))).unwrap();
            let signaller = {
                let (ids, woken, stop) = (ids.clone(), woken.clone(), stop.clone());
                corewise::spawn(move || {
                    // Long enough for every waiter to leave its slot at the
                    // dispatcher's sweeps (every 100 µs while it switches
                    // between this thread and the yielder).
                    let t0 = Instant::now();
                    while ids.lock().unwrap().len() < N || t0.elapsed() < Duration::from_millis(20)
                    {
                        corewise::yield_now();
                    }
                    let ids = ids.lock().unwrap().clone();
                    for (flag, id) in woken.iter().zip(ids) {
                        flag.store(true, Ordering::Release);
                        corewise::signal(id);
                    }
                    stop.store(true, Ordering::Release);
                    // Leaves its slot by sleeping, not by ending: a thread
                    // that ends while others wait hands its slot (behind
                    // the scan) to the oldest of them.
                    corewise::sleep(Duration::from_millis(20));
                })
                .unwrap()
            };
            // Keeps the dispatcher switching (a lone thread's yield returns
            // at once), in the slot after the signaller's.
            let yielder = corewise::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    corewise::yield_now();
                }
            })
            .unwrap();
            let waiters: Vec<_> = (0..N)
                .map(|i| {
                    let (order, woken) = (order.clone(), woken.clone());
                    corewise::spawn(move || {
                        while !woken[i].load(Ordering::Acquire) {
                            corewise::block();
                        }
                        order.lock().unwrap().push(i);
                    })
                    .unwrap()
                })
                .collect();
            ids.lock()
                .unwrap()
                .extend(waiters.iter().map(|h| h.thread()));
            for h in [sleeper, signaller, yielder].into_iter().chain(waiters) {
                h.join().unwrap();
            }
            Arc::try_unwrap(order).unwrap().into_inner().unwrap()
        })
        .unwrap();
    assert_eq!(order, (0..N).collect::<Vec<_>>());
}

#[test]
fn yield_interleaves_threads_on_one_core() {
    let rt = two_core_runtime();
    let log = Arc::new(Mutex::new(Vec::new()));
    // Both threads start before either logs: the spawner is an OS thread,
    // and the first thread could otherwise finish before the second exists.
    let started = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..2)
        .map(|id| {
            let (log, started) = (log.clone(), started.clone());
            Builder::new()
                .core(1)
                .spawn_in(&rt, move || {
                    started.fetch_add(1, Ordering::AcqRel);
                    while started.load(Ordering::Acquire) < 2 {
                        corewise::yield_now();
                    }
                    for _ in 0..5 {
                        log.lock().unwrap().push(id);
                        corewise::yield_now();
                    }
                })
                .unwrap()
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let log = log.lock().unwrap();
    let switches = log.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches >= 8, "yield did not alternate: {log:?}");
}

#[test]
fn sleep_lasts_at_least_its_duration_and_frees_the_core() {
    let rt = two_core_runtime();
    let progress = Arc::new(AtomicUsize::new(0));
    let p = progress.clone();
    let sleeper = Builder::new()
        .core(0)
        .spawn_in(&rt, || {
            let t = Instant::now();
            corewise::sleep(Duration::from_millis(20));
            t.elapsed()
        })
        .unwrap();
    let worker = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            for _ in 0..1000 {
                p.fetch_add(1, Ordering::Relaxed);
                corewise::yield_now();
            }
        })
        .unwrap();
    worker.join().unwrap();
    assert_eq!(progress.load(Ordering::Relaxed), 1000);
    assert!(sleeper.join().unwrap() >= Duration::from_millis(20));
}

#[test]
fn block_and_signal_ping_pong_across_cores() {
    let rt = two_core_runtime();
    const ROUNDS: usize = 100_000;
    let turn = Arc::new(AtomicUsize::new(0));
    let (ta, tb) = (turn.clone(), turn.clone());
    let b = Builder::new()
        .core(1)
        .spawn_in(&rt, move || {
            let a_id = loop {
                let v = tb.load(Ordering::Acquire);
                if v != 0 {
                    break v;
                }
                corewise::yield_now();
            };
            let _ = a_id;
            for i in 0..ROUNDS {
                while tb.load(Ordering::Acquire) != 2 * i + 1 {
                    corewise::block();
                }
                tb.store(2 * i + 2, Ordering::Release);
                corewise::signal(A_ID.get().copied().unwrap());
            }
        })
        .unwrap();
    static A_ID: std::sync::OnceLock<corewise::ThreadId> = std::sync::OnceLock::new();
    static B_ID: std::sync::OnceLock<corewise::ThreadId> = std::sync::OnceLock::new();
    B_ID.set(b.thread()).unwrap();
    let a = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            A_ID.set(corewise::current().unwrap()).unwrap();
            for i in 0..ROUNDS {
                ta.store(2 * i + 1, Ordering::Release);
                corewise::signal(*B_ID.get().unwrap());
                while ta.load(Ordering::Acquire) != 2 * i + 2 {
                    corewise::block();
                }
            }
        })
        .unwrap();
    a.join().unwrap();
    b.join().unwrap();
    assert_eq!(turn.load(Ordering::Relaxed), 2 * ROUNDS);
}

#[test]
fn spawn_never_fails_for_want_of_slots_and_the_limit_refuses_or_waits() {
    // Every slot busy with threads that keep running (they yield, never
    // block): the extra threads wait for slots in the runtime and all run.
    let rt = corewise::Runtime::builder()
        .min_cores(2)
        .max_threads(56 * 2 + 400)
        .build()
        .unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let ran = Arc::new(AtomicUsize::new(0));
    let total = 56 * rt.cores() + 300;
    let mut held = Vec::new();
    for _ in 0..total {
        let (r, n) = (release.clone(), ran.clone());
        held.push(
            rt.spawn(move || {
                n.fetch_add(1, Ordering::Relaxed);
                while !r.load(Ordering::Acquire) {
                    corewise::yield_now();
                }
            })
            .expect("a spawn never fails for want of a slot"),
        );
    }
    let start = std::time::Instant::now();
    while ran.load(Ordering::Relaxed) < total {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} of {total} threads ran while the slots were busy",
            ran.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    release.store(true, Ordering::Release);
    for h in held {
        h.join().unwrap();
    }
    // The thread limit: blocked threads hold every context.
    let rt = corewise::Runtime::builder()
        .min_cores(1)
        .max_threads(56 * rt.cores() + 8)
        .build()
        .unwrap();
    let gate = Arc::new(corewise::sync::Semaphore::new(0));
    let mut held = Vec::new();
    let refused = loop {
        let g = gate.clone();
        match rt.spawn(move || g.acquire()) {
            Ok(h) => held.push(h),
            Err(e) => break e,
        }
        assert!(held.len() <= 1_000, "the thread limit never applied");
    };
    assert!(
        matches!(refused, SpawnError::ThreadLimit { .. }),
        "{refused}"
    );
    // The waiting variant waits until a thread ends.
    let g = gate.clone();
    let waiter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        g.release();
    });
    let late = Builder::new()
        .wait_at_limit(true)
        .spawn_in(&rt, || 99)
        .unwrap();
    assert_eq!(late.join().unwrap(), 99);
    waiter.join().unwrap();
    for _ in 0..held.len() {
        gate.release();
    }
    for h in held {
        h.join().unwrap();
    }
}

/// A user thread that spawns faster than its cores start threads (every
/// slot taken) yields after each such spawn, so the threads it made start
/// instead of piling up in the core's queue (each one a context and a
/// stack). Without that, the one core of this runtime runs nothing but the
/// spawner until a monitor request interrupts it, and nearly all 20 000
/// threads wait to start at once.
#[test]
fn a_spawner_that_outruns_its_core_lets_the_threads_it_made_start() {
    const N: usize = 20_000;
    let rt = Runtime::builder()
        .cpus([0])
        .neighbour_awareness(None)
        .build()
        .unwrap();
    let most_waiting = rt
        .block_on(|| {
            let started = Arc::new(AtomicUsize::new(0));
            let mut most_waiting = 0;
            let mut hs = Vec::with_capacity(N);
            for spawned in 1..=N {
                let s = started.clone();
                hs.push(
                    corewise::spawn(move || {
                        s.fetch_add(1, Ordering::Relaxed);
                        corewise::sleep(Duration::from_millis(20));
                    })
                    .unwrap(),
                );
                most_waiting = most_waiting.max(spawned - started.load(Ordering::Relaxed));
            }
            for h in hs {
                h.join().unwrap();
            }
            most_waiting
        })
        .unwrap();
    assert!(
        most_waiting < 1_000,
        "{most_waiting} threads made by one spawning thread waited to start at once"
    );
}

/// On `rt`'s one core: a thread sleeps 2 ms while the calling thread
/// computes for `compute` and then makes a write and a read on a socket
/// pair that is always ready (calls that never wait), round after round,
/// until the sleeper has run; returns the rounds. Fails after 10 s: the
/// sleeper's timer is only served if the computing thread yields.
fn rounds_until_a_sleeper_runs(rt: &Runtime, compute: Duration) -> u64 {
    use std::io::{Read, Write};
    rt.block_on(move || {
        let woke = Arc::new(AtomicBool::new(false));
        let w = woke.clone();
        let sleeper = corewise::spawn(move || {
            corewise::sleep(Duration::from_millis(2));
            w.store(true, Ordering::Release);
        })
        .unwrap();
        // The sleeper starts (and goes to sleep) first.
        corewise::thread::yield_now();
        let (mut a, mut b) = corewise::net::UnixStream::pair().unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 4];
        let mut rounds = 0u64;
        while !woke.load(Ordering::Acquire) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the sleeper did not run in 10 s: {rounds} rounds without a yield"
            );
            let t = Instant::now();
            while t.elapsed() < compute {
                std::hint::spin_loop();
            }
            a.write_all(b"ping").unwrap();
            b.read_exact(&mut buf).unwrap();
            rounds += 1;
        }
        sleeper.join().unwrap();
        rounds
    })
    .unwrap()
}

/// A thread that keeps its core in runtime calls that never wait (epoll
/// back end) yields after about a millisecond while another thread waits
/// for the core, by its own clock: the handoff monitor is off here.
#[test]
fn a_thread_in_runtime_calls_yields_to_a_waiting_one_without_the_monitor() {
    let rt = Runtime::builder()
        .cpus([0])
        .neighbour_awareness(None)
        .blocking_handoff(false)
        .io_backend(corewise::io::IoBackend::Epoll)
        .build()
        .unwrap();
    assert!(rounds_until_a_sleeper_runs(&rt, Duration::ZERO) > 0);
}

/// A thread that computes 3 ms between runtime calls, so that its own
/// clock (read every 32 calls) would time its run only after ~100 ms,
/// yields at the handoff monitor's request (a flag, no signal) while
/// another thread waits for the core: the core is not handed over, as it
/// would be after 10 ms of computing.
#[test]
fn a_long_run_of_few_runtime_calls_yields_before_its_core_is_handed_over() {
    let rt = Runtime::builder()
        .cpus([0])
        .neighbour_awareness(None)
        .io_backend(corewise::io::IoBackend::Epoll)
        .build()
        .unwrap();
    let rounds = rounds_until_a_sleeper_runs(&rt, Duration::from_millis(3));
    let handoffs = rt.stats().handoffs;
    assert_eq!(
        handoffs, 0,
        "the core was handed over ({rounds} rounds) instead of the thread yielding"
    );
}

#[test]
fn an_exclusive_thread_keeps_its_core_alone() {
    let rt = two_core_runtime();
    if rt.cores() < 2 {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let ex = rt
        .spawn_with(ThreadClass::Exclusive, move || {
            let me = corewise::current_core().unwrap();
            while !s.load(Ordering::Acquire) {
                corewise::sleep(Duration::from_micros(200));
            }
            me
        })
        .unwrap();
    let ex_core = ex.thread().core();
    // Normal threads never land on the exclusive core.
    let cores: Vec<usize> = (0..300)
        .map(|_| rt.spawn(|| corewise::current_core().unwrap()).unwrap())
        .map(|h| h.join().unwrap())
        .collect();
    assert!(
        cores.iter().all(|&c| c != ex_core),
        "{cores:?} vs {ex_core}"
    );
    // A second exclusive thread cannot get the remaining (busy) core while
    // normal threads may still need it... but it can once it is empty.
    stop.store(true, Ordering::Release);
    assert_eq!(ex.join().unwrap(), ex_core);
    // The core is free for normal threads again.
    let again: Vec<usize> = (0..300)
        .map(|_| rt.spawn(|| corewise::current_core().unwrap()).unwrap())
        .map(|h| h.join().unwrap())
        .collect();
    assert!(again.contains(&ex_core));
}

#[test]
fn a_thread_can_spawn_and_join_from_within() {
    let rt = two_core_runtime();
    let total = rt
        .block_on(|| {
            let hs: Vec<_> = (0..50u64)
                .map(|i| {
                    corewise::spawn_wait(move || {
                        let inner = corewise::spawn_wait(move || i + 1).unwrap();
                        inner.join().unwrap()
                    })
                    .unwrap()
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        })
        .unwrap();
    assert_eq!(total, (1..=50).sum::<u64>());
}

#[test]
fn spawn_outside_a_user_thread_says_so() {
    assert!(matches!(
        corewise::spawn(|| ()),
        Err(SpawnError::NotInRuntime)
    ));
}

#[test]
fn an_unknown_core_is_refused() {
    let rt = two_core_runtime();
    let r = Builder::new().core(63).spawn_in(&rt, || ());
    assert!(matches!(r, Err(SpawnError::CoreUnavailable(63))));
}

#[test]
fn idle_cores_sleep_in_the_kernel() {
    let rt = Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .idle_spin(Duration::from_micros(10))
        .build()
        .unwrap();
    rt.spawn(|| ()).unwrap().join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = rt.core_stats();
        if stats.iter().all(|s| s.sleeping && s.sleeps > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "cores never slept: {stats:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The kernel agrees: every core thread is in state S (sleeping).
    let me = std::process::id();
    let mut sleeping = 0;
    for entry in std::fs::read_dir(format!("/proc/{me}/task")).unwrap() {
        let dir = entry.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("corewise-core") {
            continue;
        }
        // A thread of another test's runtime may have exited since the
        // directory was listed.
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let state = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        if state == "S" {
            sleeping += 1;
        }
    }
    assert!(
        sleeping >= rt.active_cores(),
        "only {sleeping} core threads asleep"
    );
    // A spawn wakes a sleeping core.
    assert_eq!(rt.spawn(|| 1).unwrap().join().unwrap(), 1);
}

#[test]
fn runtime_builder_rejects_bad_settings() {
    assert!(Runtime::builder().stack_size(1024).build().is_err());
    assert!(Runtime::builder().cpus([4096]).build().is_err());
}

#[test]
fn a_runtime_restricted_to_one_cpu_uses_only_it() {
    let rt = Runtime::builder().cpus([1]).build().unwrap();
    assert_eq!(rt.cores(), 1);
    let cpus: Vec<usize> = (0..100)
        .map(|_| rt.spawn(rustix::thread::sched_getcpu).unwrap())
        .map(|h| h.join().unwrap())
        .collect();
    assert!(cpus.iter().all(|&c| c == 1));
}

#[test]
fn dropping_a_runtime_waits_for_its_threads() {
    let done = Arc::new(AtomicBool::new(false));
    {
        let rt = two_core_runtime();
        let d = done.clone();
        rt.spawn(move || {
            corewise::sleep(Duration::from_millis(10));
            d.store(true, Ordering::Release);
        })
        .unwrap();
    }
    assert!(done.load(Ordering::Acquire));
}

/// A runtime dropped while its thread panics does not wait for threads that
/// wait for something the panicking code would have done: the panic goes on
/// (a failing test fails instead of hanging).
#[test]
fn dropping_a_runtime_while_panicking_does_not_wait() {
    let release = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let r = release.clone();
    let dropper = std::thread::spawn(move || {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let rt = two_core_runtime();
            let r = r.clone();
            rt.spawn(move || {
                while !r.load(Ordering::Acquire) {
                    corewise::sleep(Duration::from_millis(1));
                }
            })
            .unwrap();
            std::panic::resume_unwind(Box::new("the test's assertion failed"));
        }));
        tx.send(caught.is_err()).unwrap();
    });
    let unwound = rx.recv_timeout(Duration::from_secs(20));
    release.store(true, Ordering::Release);
    dropper.join().unwrap();
    assert_eq!(
        unwound,
        Ok(true),
        "the panic waited in Runtime::drop for a thread it should have released"
    );
}

/// Sets `go` when dropped, so a failing assertion releases the waiting
/// threads instead of leaving `Runtime::drop` waiting for them forever.
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A user thread's body: waits (sleeping) until `go` is set, then says
/// which core it ran on.
/// The thread returns the core it was placed on at creation (where it
/// first ran): a thread that blocks may be placed elsewhere when it wakes.
fn wait_for(go: Arc<AtomicBool>) -> impl FnOnce() -> usize + Send + 'static {
    move || {
        let first = corewise::current_core().unwrap();
        while !go.load(Ordering::Acquire) {
            corewise::sleep(Duration::from_millis(1));
        }
        first
    }
}

/// Spawns `n` threads onto core 1 that wait until `go` is set, from the
/// calling user thread, without switching out in between.
fn spawn_waiting_on_core_1(n: usize, go: &Arc<AtomicBool>) -> Vec<corewise::JoinHandle<usize>> {
    (0..n)
        .map(|_| Builder::new().core(1).spawn(wait_for(go.clone())).unwrap())
        .collect()
}

/// Spawns `n` threads placed by the runtime that wait until `go` is set.
/// They wait runnable (yielding), so each stays in its slot and counts in
/// its core's load however long the spawner takes (a sleeping thread
/// leaves its slot, and placement then rightly sees its core as lighter).
fn spawn_waiting_placed(n: usize, go: &Arc<AtomicBool>) -> Vec<corewise::JoinHandle<usize>> {
    (0..n)
        .map(|_| {
            let go = go.clone();
            corewise::spawn(move || {
                let first = corewise::current_core().unwrap();
                while !go.load(Ordering::Acquire) {
                    corewise::yield_now();
                }
                first
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn a_burst_reserves_slots_ahead_and_gives_them_back_when_it_switches_out() {
    let rt = two_core_runtime();
    let spawned = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicUsize::new(usize::MAX));
    let go = Arc::new(AtomicBool::new(false));
    let _release = Release(go.clone());
    let (s2, c2, g2, a2) = (spawned.clone(), checked.clone(), go.clone(), after.clone());
    let spawner = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            let hs = spawn_waiting_on_core_1(3, &g2);
            s2.store(true, Ordering::Release);
            // Still the same run: no switch while the main thread looks.
            while !c2.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            // A real switch out (a sleep), then the count from inside the
            // same thread, before it exits.
            corewise::sleep(Duration::from_millis(2));
            a2.store(1, Ordering::Release);
            while a2.load(Ordering::Acquire) == 1 {
                corewise::sleep(Duration::from_millis(1));
            }
            hs
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !spawned.load(Ordering::Acquire) {
        assert!(
            Instant::now() < deadline,
            "the spawner never finished its burst"
        );
        std::thread::yield_now();
    }
    let during = rt.core_stats()[1].threads;
    checked.store(true, Ordering::Release);
    assert!(
        during > 3,
        "a burst of 3 spawns onto core 1 reserved nothing ahead ({during} slots taken)"
    );
    // The spawner slept (switched out) and is still alive: only the three
    // waiting threads hold slots on core 1.
    while after.load(Ordering::Acquire) != 1 {
        assert!(Instant::now() < deadline, "the spawner never slept");
        std::thread::yield_now();
    }
    let settled = rt.core_stats()[1].threads;
    after.store(0, Ordering::Release);
    assert_eq!(
        settled, 3,
        "reserved slots not given back at the switch out"
    );
    let hs = spawner.join().unwrap();
    go.store(true, Ordering::Release);
    for h in hs {
        h.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while rt.core_stats()[1].threads != 0 {
        assert!(Instant::now() < deadline, "slots still taken on core 1");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_burst_can_fill_a_core_to_the_last_slot_and_no_further() {
    let rt = two_core_runtime();
    let go = Arc::new(AtomicBool::new(false));
    let _release = Release(go.clone());
    let g2 = go.clone();
    let (hs, full) = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            let hs = spawn_waiting_on_core_1(56, &g2);
            let full = Builder::new().core(1).spawn(|| ()).map(|_| ());
            (hs, full)
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(
        full.is_ok(),
        "the 57th spawn onto core 1 waits for a slot there: {full:?}"
    );
    go.store(true, Ordering::Release);
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn a_burst_of_long_threads_is_still_spread_over_the_cores() {
    let rt = two_core_runtime();
    let go = Arc::new(AtomicBool::new(false));
    let _release = Release(go.clone());
    let g2 = go.clone();
    let hs = Builder::new()
        .core(0)
        .spawn_in(&rt, move || spawn_waiting_placed(40, &g2))
        .unwrap()
        .join()
        .unwrap();
    go.store(true, Ordering::Release);
    let mut on = [0usize; 2];
    for h in hs {
        on[h.join().unwrap()] += 1;
    }
    // Power of two choices over two cores keeps the counts within a few
    // threads of each other (the spawner itself occupied core 0).
    assert!(on[0].abs_diff(on[1]) <= 4, "40 threads landed {on:?}");
}

#[test]
fn slots_reserved_by_pinned_spawns_do_not_capture_placed_ones() {
    let rt = two_core_runtime();
    let go = Arc::new(AtomicBool::new(false));
    let _release = Release(go.clone());
    let g2 = go.clone();
    let (pinned, placed) = Builder::new()
        .core(0)
        .spawn_in(&rt, move || {
            // Two spawns pinned to core 1 in one run: the second reserves.
            let pinned = spawn_waiting_on_core_1(2, &g2);
            // Placed by power of two choices in the same run: core 1 now
            // looks fuller (its reserved slots count), so they go to 0.
            let placed = spawn_waiting_placed(7, &g2);
            (pinned, placed)
        })
        .unwrap()
        .join()
        .unwrap();
    go.store(true, Ordering::Release);
    let mut on = [0usize; 2];
    for h in placed {
        on[h.join().unwrap()] += 1;
    }
    for h in pinned {
        h.join().unwrap();
    }
    assert!(on[0] >= 5, "placed threads landed {on:?}");
}

#[test]
fn a_core_added_under_load_receives_running_threads() {
    // Neighbour awareness off: on a busy machine it would rightly keep the
    // second core for the neighbours, and the test is of the placement.
    let rt = Runtime::builder()
        .min_cores(1)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    if rt.cores() < 2 {
        return;
    }
    rt.set_max_cores(1);
    let start = Instant::now();
    while rt.active_cores() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "core 1 not released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // 50 threads that keep running (they yield, never block), all on the
    // one core the runtime holds.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..50)
        .map(|_| {
            let (stop, seen) = (stop.clone(), seen.clone());
            rt.spawn(move || {
                let mut moved = false;
                while !stop.load(Ordering::Relaxed) {
                    if !moved && corewise::current_core() == Some(1) {
                        moved = true;
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                    corewise::yield_now();
                }
            })
            .unwrap()
        })
        .collect();
    rt.set_max_cores(2);
    let start = Instant::now();
    while seen.load(Ordering::Relaxed) < 10 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {} of 50 running threads moved to the added core",
            seen.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn a_cancel_and_a_completion_reach_threads_that_left_their_slot() {
    for backend in [corewise::IoBackend::Uring, corewise::IoBackend::Epoll] {
        let rt = Runtime::builder().io_backend(backend).build().unwrap();
        rt.block_on(move || {
            let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let mut client = std::net::TcpStream::connect(addr).unwrap();
            let (a, _) = l.accept().unwrap();
            let (b_client, _) = (std::net::TcpStream::connect(addr).unwrap(), ());
            let (b, _) = l.accept().unwrap();
            let cancel = a.canceller();
            let waiting = |s: corewise::net::TcpStream| {
                corewise::spawn(move || {
                    let mut buf = [0u8; 4];
                    let r = s.read(&mut buf);
                    (r.map(|n| buf[..n].to_vec()), s)
                })
                .unwrap()
            };
            let (ha, hb) = (waiting(a), waiting(b));
            // Long enough for both readers to leave their slots (a sweep
            // is 100 µs; an idle core parks its blocked threads at once).
            corewise::sleep(Duration::from_millis(20));
            cancel.cancel();
            use std::io::Write;
            (&b_client).write_all(b"ping").unwrap();
            let (ra, _a) = ha.join().unwrap();
            let e = ra.unwrap_err();
            assert!(corewise::io::is_cancelled(&e), "{backend:?}: {e}");
            let (rb, _b) = hb.join().unwrap();
            assert_eq!(rb.unwrap(), b"ping", "{backend:?}");
            client.write_all(b"x").unwrap();
        })
        .unwrap();
    }
}

/// Threads that wait for a slot run before threads spawned after them.
/// One core, its 56 slots full of threads that compute 1 ms each; 20 more
/// are spawned (they wait), then, once a few of the first have ended,
/// 5 more. Those 5 used to claim the slots the ended threads freed, and
/// ran a whole rotation of the slots before the 20 that had waited.
#[test]
fn threads_waiting_for_a_slot_are_not_overtaken_by_later_spawns() {
    const SLOTS: usize = 56;
    let rt = one_core_runtime();
    let order = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let spawn = |wait_for_go: bool| {
        let (order, ended, go) = (order.clone(), ended.clone(), go.clone());
        Builder::new()
            .spawn_in(&rt, move || {
                let start = order.fetch_add(1, Ordering::SeqCst);
                if wait_for_go {
                    // Computes (no runtime call) until every spawn of the
                    // test's first two groups has been made.
                    while !go.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                }
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(1) {
                    std::hint::spin_loop();
                }
                ended.fetch_add(1, Ordering::SeqCst);
                start
            })
            .unwrap()
    };
    let first: Vec<_> = (0..SLOTS).map(|_| spawn(true)).collect();
    let waiting: Vec<_> = (0..20).map(|_| spawn(false)).collect();
    go.store(true, Ordering::Release);
    let t = Instant::now();
    while ended.load(Ordering::SeqCst) < 3 {
        assert!(t.elapsed() < Duration::from_secs(60), "no thread ended");
        std::thread::sleep(Duration::from_micros(100));
    }
    let later: Vec<_> = (0..5).map(|_| spawn(false)).collect();
    for h in first {
        h.join().unwrap();
    }
    let waited: Vec<usize> = waiting.into_iter().map(|h| h.join().unwrap()).collect();
    let late: Vec<usize> = later.into_iter().map(|h| h.join().unwrap()).collect();
    let last_waited = waited.iter().max().unwrap();
    let first_late = late.iter().min().unwrap();
    assert!(
        last_waited < first_late,
        "threads spawned later started before ones that waited: waited {waited:?}, later {late:?}"
    );
}

/// A runtime's drop does not wait out the deadlines of waits that ended
/// early. A thread woken long before its timeout leaves its timer on the
/// core that parked it (it would fire as a spurious signal); at shutdown,
/// with no thread left anywhere, the cores waited for those timers: here
/// an hour, for a condition variable notified after 20 ms.
#[test]
fn dropping_a_runtime_does_not_wait_for_deadlines_of_answered_waits() {
    use corewise::sync::{Condvar, Mutex};
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = Runtime::builder()
            .neighbour_awareness(None)
            .build()
            .expect("runtime");
        rt.block_on(|| {
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p = pair.clone();
            let waiter = corewise::spawn(move || {
                let mut g = p.0.lock();
                while !*g {
                    g = p.1.wait_timeout(g, Duration::from_secs(3600)).0;
                }
            })
            .unwrap();
            // Long enough for the waiter to leave its slot for the timers.
            corewise::sleep(Duration::from_millis(20));
            *pair.0.lock() = true;
            pair.1.notify_one();
            waiter.join().unwrap();
        })
        .unwrap();
        let t = Instant::now();
        drop(rt);
        let _ = tx.send(t.elapsed());
    });
    let took = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the runtime's drop waited for an answered wait's deadline");
    assert!(took < Duration::from_secs(60), "{took:?}");
}
