//! `Runtime::stats` on a real runtime: threads in slots and parked, a busy
//! core's utilization and load factor, and cores taken and given back.

use corewise::thread::Builder;
use corewise::Runtime;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_busy_core_shows_its_utilization_and_load() {
    let rt = Runtime::builder()
        .max_cores(1)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Two runnable threads on core 0: busy, load factor about 2.
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            Builder::new()
                .core(0)
                .spawn_in(&rt, move || {
                    while !stop.load(Ordering::Relaxed) {
                        corewise::yield_now();
                    }
                })
                .unwrap()
        })
        .collect();
    let window = rt.stats().window;
    std::thread::sleep(window * 3);
    wait_until("a window with core 0 busy", || {
        let c = &rt.stats().cores[0];
        c.utilization > 0.5 && c.load_factor > 1.0
    });
    let s = rt.stats();
    assert!(s.cores[0].threads >= 2, "{s:?}");
    assert!(s.cores[0].dispatches > 0, "{s:?}");
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    // Idle again: the next windows show it.
    wait_until("core 0 idle", || rt.stats().cores[0].utilization < 0.5);
}

#[test]
fn blocked_threads_are_counted_as_parked() {
    let rt = Runtime::builder()
        .neighbour_awareness(None)
        .build()
        .unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..10)
        .map(|_| {
            let go = go.clone();
            rt.spawn(move || {
                while !go.load(Ordering::Acquire) {
                    corewise::block();
                }
            })
            .unwrap()
        })
        .collect();
    wait_until("ten parked threads", || rt.stats().parked >= 10);
    go.store(true, Ordering::Release);
    for h in &hs {
        corewise::signal(h.thread());
    }
    for h in hs {
        h.join().unwrap();
    }
    wait_until("no parked threads", || rt.stats().parked == 0);
}

#[test]
fn core_grants_and_releases_are_counted() {
    let rt = Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    if rt.cores() < 2 || rt.active_cores() < 2 {
        eprintln!("skipping: needs two cores");
        return;
    }
    let s = rt.stats();
    assert_eq!(s.granted_cores, 2, "{s:?}");
    assert_eq!(s.requested_cores, 2, "{s:?}");
    assert!(s.cores_added >= 2, "{s:?}");
    let released = s.cores_released;
    rt.set_max_cores(1);
    // A core stops taking threads (inactive) before it has handed its own
    // over and is counted released: wait for both.
    wait_until("one core held and released", || {
        let s = rt.stats();
        s.active_cores == 1 && s.cores_released == released + 1
    });
    let s = rt.stats();
    assert_eq!((s.granted_cores, s.requested_cores), (1, 1), "{s:?}");
    assert_eq!(s.cores_released, released + 1, "{s:?}");
    assert_eq!(s.cores.iter().filter(|c| c.active).count(), 1, "{s:?}");
    let added = s.cores_added;
    rt.set_max_cores(usize::MAX);
    wait_until("two cores held again", || rt.stats().active_cores == 2);
    assert_eq!(rt.stats().cores_added, added + 1);
}

#[test]
fn runtime_stats_is_the_callers_runtime() {
    assert!(corewise::runtime_stats().is_none());
    let rt = Runtime::builder().max_cores(1).build().unwrap();
    let inside = rt.block_on(corewise::runtime_stats).unwrap().unwrap();
    assert_eq!(inside.cores.len(), rt.cores());
    assert!(inside.cores.iter().any(|c| c.threads >= 1), "{inside:?}");
}
