//! Synchronization under load: many user threads on both cores, millions of
//! operations, and the checks that no wakeup is lost and nothing deadlocks
//! (a lost wakeup shows up as a hang, which the harness reports).

use corewise::sync::{channel, Condvar, Mutex, RecvTimeoutError, Semaphore, SpinLock};
use corewise::thread::Builder;
use corewise::Runtime;
use std::sync::atomic::{AtomicUsize, Ordering};
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
