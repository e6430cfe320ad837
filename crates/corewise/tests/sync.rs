//! Synchronization under load: many user threads on both cores, millions of
//! operations, and the checks that no wakeup is lost and nothing deadlocks
//! (a lost wakeup shows up as a hang, which the harness reports). The
//! std-shaped primitives (`RwLock`, `OnceLock`, `Once`, `Barrier`) also
//! check exclusion, that nothing runs twice, and that a writer gets in
//! while readers keep coming (that check fails rather than hangs).

use corewise::sync::{
    channel, Barrier, Condvar, Mutex, Once, OnceLock, RecvTimeoutError, RwLock, Semaphore, SpinLock,
};
use corewise::thread::Builder;
use corewise::Runtime;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Both cores held all the time, so the primitives are used across cores.
fn both_cores() -> Runtime {
    Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap()
}

fn spawn_all<T: Send + 'static>(
    rt: &Runtime,
    n: usize,
    f: impl Fn(usize) -> Box<dyn FnOnce() -> T + Send> + Send,
) -> Vec<T> {
    let hs: Vec<_> = (0..n)
        .map(|i| {
            Builder::new()
                .wait_at_limit(true)
                .spawn_in(rt, f(i))
                .unwrap()
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn mutex_counts_a_million_increments_from_both_cores() {
    let rt = both_cores();
    let m = Arc::new(Mutex::new(0u64));
    spawn_all(&rt, 100, |_| {
        let m = m.clone();
        Box::new(move || {
            for i in 0..10_000 {
                *m.lock() += 1;
                if i % 100 == 0 {
                    corewise::yield_now();
                }
            }
        })
    });
    assert_eq!(*m.lock(), 1_000_000);
}

#[test]
fn spin_lock_counts_a_million_increments() {
    let rt = both_cores();
    let l = Arc::new(SpinLock::new(0u64));
    spawn_all(&rt, 50, |_| {
        let l = l.clone();
        Box::new(move || {
            for _ in 0..20_000 {
                *l.lock() += 1;
            }
        })
    });
    assert_eq!(*l.lock(), 1_000_000);
}

#[test]
fn condvar_ping_pong_never_loses_a_notify() {
    let rt = both_cores();
    const ROUNDS: u64 = 100_000;
    let state = Arc::new((Mutex::new(0u64), Condvar::new()));
    let players: Vec<_> = (0..2u64)
        .map(|me| {
            let s = state.clone();
            Builder::new()
                .core(me as usize % rt.cores())
                .spawn_in(&rt, move || {
                    let (m, cv) = &*s;
                    loop {
                        let mut g = m.lock();
                        while *g % 2 != me && *g < 2 * ROUNDS {
                            g = cv.wait(g);
                        }
                        if *g >= 2 * ROUNDS {
                            cv.notify_all();
                            return;
                        }
                        *g += 1;
                        cv.notify_all();
                    }
                })
                .unwrap()
        })
        .collect();
    for p in players {
        p.join().unwrap();
    }
    assert_eq!(*state.0.lock(), 2 * ROUNDS);
}

#[test]
fn condvar_wait_timeout_times_out_and_wakes() {
    let rt = both_cores();
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let p = pair.clone();
    let timed_out = rt
        .block_on(move || {
            let (m, cv) = &*p;
            let t = Instant::now();
            let (_g, r) = cv.wait_timeout(m.lock(), Duration::from_millis(5));
            (r.timed_out(), t.elapsed())
        })
        .unwrap();
    assert!(timed_out.0 && timed_out.1 >= Duration::from_millis(5));
    let p = pair.clone();
    let waiter = rt
        .spawn(move || {
            let (m, cv) = &*p;
            let mut g = m.lock();
            while !*g {
                let (ng, r) = cv.wait_timeout(g, Duration::from_secs(30));
                assert!(!r.timed_out(), "notify lost");
                g = ng;
            }
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(2));
    *pair.0.lock() = true;
    pair.1.notify_one();
    waiter.join().unwrap();
}

#[test]
fn semaphore_bounds_concurrency_across_cores() {
    let rt = both_cores();
    let sem = Arc::new(Semaphore::new(3));
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    spawn_all(&rt, 60, |_| {
        let (sem, inside, peak) = (sem.clone(), inside.clone(), peak.clone());
        Box::new(move || {
            for _ in 0..2_000 {
                sem.acquire();
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                corewise::yield_now();
                inside.fetch_sub(1, Ordering::SeqCst);
                sem.release();
            }
        })
    });
    assert!(peak.load(Ordering::SeqCst) <= 3);
    assert_eq!(sem.available(), 3);
    assert!(!Semaphore::new(0).acquire_timeout(Duration::from_millis(1)));
}

#[test]
fn channel_carries_a_million_items_between_many_threads() {
    let rt = both_cores();
    let (tx, rx) = channel::<u64>(64);
    const PRODUCERS: u64 = 8;
    const PER: u64 = 125_000;
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = tx.clone();
            rt.spawn(move || {
                for i in 0..PER {
                    tx.send(p * PER + i).unwrap();
                }
            })
            .unwrap()
        })
        .collect();
    drop(tx);
    let consumers: Vec<_> = (0..8)
        .map(|_| {
            let rx = rx.clone();
            rt.spawn(move || {
                let (mut n, mut sum) = (0u64, 0u64);
                while let Ok(v) = rx.recv() {
                    n += 1;
                    sum += v;
                }
                (n, sum)
            })
            .unwrap()
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let (n, sum) = consumers
        .into_iter()
        .map(|c| c.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let total = PRODUCERS * PER;
    assert_eq!(n, total);
    assert_eq!(sum, total * (total - 1) / 2);
}

#[test]
fn channel_connects_os_threads_and_user_threads() {
    let rt = both_cores();
    let (to_user, from_os) = channel::<u32>(1);
    let (to_os, from_user) = channel::<u32>(1);
    let echo = rt
        .spawn(move || {
            while let Ok(v) = from_os.recv() {
                to_os.send(v + 1).unwrap();
            }
        })
        .unwrap();
    for i in 0..10_000 {
        to_user.send(i).unwrap();
        assert_eq!(from_user.recv().unwrap(), i + 1);
    }
    drop(to_user);
    echo.join().unwrap();
    assert_eq!(
        from_user.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Disconnected)
    );
}

/// `for x in &rx` and `for x in rx` as with std: two consumers, one
/// borrowing and one owning its receiver, drain what user-thread and
/// OS-thread producers send, and both loops end once the last sender is
/// gone; `try_iter` then finds nothing and returns at once.
#[test]
fn receivers_iterate_until_every_sender_is_gone() {
    let rt = both_cores();
    let (tx, rx) = channel::<u64>(16);
    let per = 20_000u64;
    let mut producers = Vec::new();
    for p in 0..4u64 {
        let tx = tx.clone();
        producers.push(
            rt.spawn(move || (0..per).for_each(|i| tx.send(p * per + i).unwrap()))
                .unwrap(),
        );
    }
    let os_tx = tx.clone();
    let os = std::thread::spawn(move || (4 * per..5 * per).for_each(|i| os_tx.send(i).unwrap()));
    drop(tx);
    let owned = rx.clone();
    let borrowing = rt
        .spawn(move || {
            let (mut n, mut sum) = (0u64, 0u64);
            for v in &rx {
                n += 1;
                sum += v;
            }
            assert_eq!(rx.try_iter().next(), None);
            (n, sum)
        })
        .unwrap();
    let owning = rt
        .spawn(move || {
            owned
                .into_iter()
                .fold((0u64, 0u64), |(n, s), v| (n + 1, s + v))
        })
        .unwrap();
    for p in producers {
        p.join().unwrap();
    }
    os.join().unwrap();
    let (a, b) = (borrowing.join().unwrap(), owning.join().unwrap());
    let total = 5 * per;
    assert_eq!(a.0 + b.0, total);
    assert_eq!(a.1 + b.1, total * (total - 1) / 2);
}

#[test]
fn mutex_try_lock_for_times_out_while_held_by_a_user_thread() {
    let rt = both_cores();
    let m = Arc::new(Mutex::new(()));
    let held = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let (m2, h2, r2) = (m.clone(), held.clone(), release.clone());
    let holder = rt
        .spawn(move || {
            let _g = m2.lock();
            h2.release();
            r2.acquire();
        })
        .unwrap();
    held.acquire();
    let m3 = m.clone();
    let got = rt
        .block_on(move || m3.try_lock_for(Duration::from_millis(5)).is_some())
        .unwrap();
    assert!(!got);
    release.release();
    holder.join().unwrap();
    assert!(m.try_lock_for(Duration::from_millis(5)).is_some());
}

#[test]
fn rwlock_writers_exclude_readers_across_cores() {
    const WRITERS: usize = 8;
    const WRITES: usize = 2_000;
    let rt = both_cores();
    let l = Arc::new(RwLock::new((0usize, 0usize)));
    let reads = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    // An OS thread reads too, so user and OS waiters share the queues.
    let os_reader = {
        let (l, done) = (l.clone(), done.clone());
        std::thread::spawn(move || {
            while done.load(Ordering::Relaxed) < WRITERS {
                let g = l.read();
                assert_eq!(g.0, g.1, "a reader saw half a write");
            }
        })
    };
    spawn_all(&rt, 64, |i| {
        let (l, reads, done) = (l.clone(), reads.clone(), done.clone());
        if i < WRITERS {
            Box::new(move || {
                for k in 0..WRITES {
                    let mut g = l.write();
                    g.0 += 1;
                    if k % 64 == 0 {
                        // Switched out while holding it: the others block.
                        corewise::yield_now();
                    }
                    g.1 += 1;
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        } else {
            Box::new(move || {
                while done.load(Ordering::Relaxed) < WRITERS {
                    let g = l.read();
                    assert_eq!(g.0, g.1, "a reader saw half a write");
                    reads.fetch_add(1, Ordering::Relaxed);
                    drop(g);
                    corewise::yield_now();
                }
            })
        }
    });
    os_reader.join().unwrap();
    assert_eq!(*l.read(), (WRITERS * WRITES, WRITERS * WRITES));
    assert!(reads.load(Ordering::Relaxed) > 0);
}

/// Readers that overlap (each holds its lock across a yield, so the count
/// of readers never drops to zero by itself) would keep a writer out for
/// ever if new readers could pass a waiting one.
#[test]
fn rwlock_writer_is_not_starved_by_overlapping_readers() {
    let rt = both_cores();
    let l = Arc::new(RwLock::new(0u64));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..16)
        .map(|_| {
            let (l, stop) = (l.clone(), stop.clone());
            rt.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let g = l.read();
                    corewise::yield_now();
                    n += *g;
                    drop(g);
                }
                n
            })
            .unwrap()
        })
        .collect();
    let writer = {
        let (l, stop) = (l.clone(), stop.clone());
        rt.spawn(move || {
            let mut got = 0;
            for _ in 0..200 {
                match l.try_write_for(Duration::from_secs(20)) {
                    Some(mut g) => {
                        *g += 1;
                        got += 1;
                    }
                    None => break,
                }
                corewise::yield_now();
            }
            stop.store(true, Ordering::Relaxed);
            got
        })
        .unwrap()
    };
    assert_eq!(writer.join().unwrap(), 200, "the writer was starved");
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(*l.read(), 200);
}

/// Timed readers and writers giving up while others hold and release the
/// lock: every success is counted, every thread finishes, and an untimed
/// writer and reader get in at the end.
#[test]
fn rwlock_timeouts_lose_no_wakeup() {
    let rt = both_cores();
    let l = Arc::new(RwLock::new(0usize));
    let wins = spawn_all(&rt, 48, |i| {
        let l = l.clone();
        Box::new(move || {
            let mut wins = 0;
            for k in 0..300 {
                let t = Duration::from_micros(((i * 7 + k) % 50) as u64);
                if (i + k) % 3 == 0 {
                    if let Some(mut g) = l.try_write_for(t) {
                        *g += 1;
                        wins += 1;
                        if k % 5 == 0 {
                            corewise::yield_now();
                        }
                    }
                } else if let Some(g) = l.try_read_for(t) {
                    if k % 5 == 0 {
                        corewise::yield_now();
                    }
                    drop(g);
                }
            }
            *l.write() += 0;
            drop(l.read());
            wins
        })
    });
    assert_eq!(*l.read(), wins.iter().sum::<usize>());
}

#[test]
fn once_lock_runs_one_initialiser_among_many_threads() {
    let rt = both_cores();
    for round in 0..20 {
        let cell = Arc::new(OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let seen = spawn_all(&rt, 100, |i| {
            let (cell, runs) = (cell.clone(), runs.clone());
            Box::new(move || {
                *cell.get_or_init(|| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Others arrive while this runs and must wait.
                    corewise::yield_now();
                    corewise::sleep(Duration::from_millis(1));
                    (round, i)
                })
            })
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}");
        assert!(seen.iter().all(|v| *v == seen[0]), "round {round}");
        assert_eq!(cell.get(), Some(&seen[0]));
        // `set` after the fact gives the value back.
        assert_eq!(cell.set((0, 0)), Err((0, 0)));
    }
}

/// An initialiser that panics leaves the cell empty, and a thread that
/// waited for it (or comes later) initialises it.
#[test]
fn once_lock_recovers_from_a_panicking_initialiser() {
    let rt = both_cores();
    let cell = Arc::new(OnceLock::new());
    let started = Arc::new(AtomicBool::new(false));
    let panicker = {
        let (cell, started) = (cell.clone(), started.clone());
        rt.spawn(move || {
            cell.get_or_init(|| {
                started.store(true, Ordering::SeqCst);
                corewise::sleep(Duration::from_millis(20));
                panic!("initialiser failed");
            });
        })
        .unwrap()
    };
    let waiter = {
        let (cell, started) = (cell.clone(), started.clone());
        rt.spawn(move || {
            while !started.load(Ordering::SeqCst) {
                corewise::yield_now();
            }
            *cell.get_or_init(|| 5)
        })
        .unwrap()
    };
    assert!(panicker.join().is_err());
    assert_eq!(waiter.join().unwrap(), 5);
    assert_eq!(cell.get(), Some(&5));
}

#[test]
fn once_runs_once_and_publishes_its_effects() {
    let rt = both_cores();
    for _ in 0..20 {
        let once = Arc::new(Once::new());
        let value = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let seen = spawn_all(&rt, 64, |_| {
            let (once, value, runs) = (once.clone(), value.clone(), runs.clone());
            Box::new(move || {
                once.call_once(|| {
                    runs.fetch_add(1, Ordering::Relaxed);
                    corewise::yield_now();
                    value.store(42, Ordering::Relaxed);
                });
                assert!(once.is_completed());
                value.load(Ordering::Relaxed)
            })
        });
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(seen.iter().all(|&v| v == 42));
    }
}

/// 32 user threads and one OS thread meet 200 times: in each round one
/// leader, and nobody leaves a round before everyone has arrived.
#[test]
fn barrier_rounds_across_cores_and_an_os_thread() {
    const USER: usize = 32;
    const N: usize = USER + 1;
    const ROUNDS: usize = 200;
    let rt = both_cores();
    let barrier = Arc::new(Barrier::new(N));
    let arrived: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let leaders: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ROUNDS).map(|_| AtomicUsize::new(0)).collect());
    let body = {
        let (barrier, arrived, leaders) = (barrier.clone(), arrived.clone(), leaders.clone());
        move |yielding: bool| {
            for r in 0..ROUNDS {
                arrived[r].fetch_add(1, Ordering::SeqCst);
                if yielding && r % 7 == 0 {
                    corewise::yield_now();
                }
                if barrier.wait().is_leader() {
                    leaders[r].fetch_add(1, Ordering::SeqCst);
                }
                assert_eq!(arrived[r].load(Ordering::SeqCst), N, "left round {r} early");
            }
        }
    };
    let os = {
        let body = body.clone();
        std::thread::spawn(move || body(false))
    };
    spawn_all(&rt, USER, |_| {
        let body = body.clone();
        Box::new(move || body(true))
    });
    os.join().unwrap();
    for r in 0..ROUNDS {
        assert_eq!(leaders[r].load(Ordering::SeqCst), 1, "round {r}");
    }
}

/// Runs `wait` on a user thread of the runtime this is called in, calls
/// `release` after a pause (so the waiter is blocked by then) and returns
/// what `wait` returned.
fn released_after_a_pause<T: Send + 'static>(
    wait: impl FnOnce() -> T + Send + 'static,
    release: impl FnOnce(),
) -> T {
    let h = corewise::spawn(wait).unwrap();
    corewise::sleep(Duration::from_millis(10));
    release();
    h.join().unwrap()
}

/// A timeout too large for the clock (`Duration::MAX`) means no deadline,
/// as in std: every timed wait blocks until it is released and then
/// succeeds, rather than panicking while adding the timeout to `now`.
#[test]
fn huge_timeouts_wait_until_released() {
    Runtime::new()
        .unwrap()
        .block_on(|| {
            let m = Arc::new(Mutex::new(0));
            let mut g = m.lock();
            let m2 = m.clone();
            let seen = released_after_a_pause(
                move || m2.try_lock_for(Duration::MAX).map(|g| *g),
                || {
                    *g = 1;
                    drop(g);
                },
            );
            assert_eq!(seen, Some(1), "Mutex::try_lock_for");

            let l = Arc::new(RwLock::new(0));
            let mut w = l.write();
            let l2 = l.clone();
            let seen = released_after_a_pause(
                move || l2.try_read_for(Duration::MAX).map(|g| *g),
                || {
                    *w = 1;
                    drop(w);
                },
            );
            assert_eq!(seen, Some(1), "RwLock::try_read_for");
            let r = l.read();
            let l2 = l.clone();
            let seen = released_after_a_pause(
                move || {
                    l2.try_write_for(Duration::MAX)
                        .map(|mut g| std::mem::replace(&mut *g, 2))
                },
                || drop(r),
            );
            assert_eq!((seen, *l.read()), (Some(1), 2), "RwLock::try_write_for");

            let s = Arc::new(Semaphore::new(0));
            let s2 = s.clone();
            let got =
                released_after_a_pause(move || s2.acquire_timeout(Duration::MAX), || s.release());
            assert!(got, "Semaphore::acquire_timeout");

            let (tx, rx) = channel::<u32>(1);
            let got = released_after_a_pause(
                move || rx.recv_timeout(Duration::MAX),
                || tx.send(7).unwrap(),
            );
            assert_eq!(got, Ok(7), "Receiver::recv_timeout");

            let (tx, rx) = channel::<u32>(1);
            tx.send(1).unwrap();
            let sent = released_after_a_pause(
                move || tx.send_timeout(2, Duration::MAX).is_ok(),
                || assert_eq!(rx.recv(), Ok(1)),
            );
            assert!(sent, "Sender::send_timeout");

            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let p = pair.clone();
            let woken = released_after_a_pause(
                move || {
                    let (m, cv) = &*p;
                    let mut g = m.lock();
                    while !*g {
                        let (ng, r) = cv.wait_timeout(g, Duration::MAX);
                        assert!(!r.timed_out());
                        g = ng;
                    }
                    *g
                },
                || {
                    *pair.0.lock() = true;
                    pair.1.notify_one();
                },
            );
            assert!(woken, "Condvar::wait_timeout");
        })
        .unwrap();
}
