//! `corewise::thread_local!`: per-user-thread values on real cores, their
//! destructors at exit (normal and panicking), and contexts reused by later
//! threads.

use corewise::thread::Builder;
use corewise::Runtime;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A runtime of one core: every thread shares one kernel thread.
fn one_core() -> Runtime {
    Runtime::builder()
        .max_cores(1)
        .neighbour_awareness(None)
        .build()
        .expect("runtime")
}

corewise::thread_local! {
    static VALUE: Cell<u64> = const { Cell::new(0) };
}

#[test]
fn two_threads_on_one_core_see_their_own_values() {
    let rt = one_core();
    let a_set = Arc::new(AtomicBool::new(false));
    let b_set = Arc::new(AtomicBool::new(false));
    let spawn = |mine: u64, me: Arc<AtomicBool>, other: Arc<AtomicBool>| {
        Builder::new()
            .core(0)
            .spawn_in(&rt, move || {
                let kthread = std::thread::current().id();
                VALUE.set(mine);
                me.store(true, Ordering::Release);
                // Let the other thread run on this core and set its value.
                while !other.load(Ordering::Acquire) {
                    corewise::yield_now();
                }
                assert_eq!(std::thread::current().id(), kthread, "one kernel thread");
                VALUE.get()
            })
            .unwrap()
    };
    let a = spawn(11, a_set.clone(), b_set.clone());
    let b = spawn(22, b_set, a_set);
    assert_eq!(a.join().unwrap(), 11);
    assert_eq!(b.join().unwrap(), 22);
}

#[test]
fn an_os_thread_and_a_user_thread_have_separate_values() {
    let rt = one_core();
    VALUE.set(5);
    assert_eq!(rt.block_on(|| VALUE.get()).unwrap(), 0);
    assert_eq!(VALUE.get(), 5);
}

/// Counts drops of the values made in one test.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

corewise::thread_local! {
    static TRACKED: RefCell<Option<Tracked>> = const { RefCell::new(None) };
}

#[test]
fn values_are_dropped_when_the_thread_exits_or_panics() {
    let rt = one_core();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let ok = rt.spawn(move || {
        TRACKED.set(Some(Tracked(d)));
        corewise::yield_now();
        7
    });
    assert_eq!(ok.unwrap().join().unwrap(), 7);
    // Dropped before join returned.
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    let d = drops.clone();
    let bad = rt
        .spawn(move || {
            TRACKED.set(Some(Tracked(d)));
            panic!("boom");
        })
        .unwrap();
    assert_eq!(bad.join().unwrap_err().message, "boom");
    assert_eq!(drops.load(Ordering::SeqCst), 2);

    // A detached thread's values go too.
    let d = drops.clone();
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    corewise::thread::Builder::new()
        .spawn_detached_in(&rt, move || {
            TRACKED.set(Some(Tracked(d)));
            flag.store(true, Ordering::SeqCst);
        })
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while drops.load(Ordering::SeqCst) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "detached value not dropped"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn a_destructor_panic_fails_the_join() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("bomb in destructor");
        }
    }
    corewise::thread_local!(static BOMB: RefCell<Option<Bomb>> = const { RefCell::new(None) });
    let rt = one_core();
    let h = rt
        .spawn(|| {
            BOMB.set(Some(Bomb));
            1
        })
        .unwrap();
    assert_eq!(h.join().unwrap_err().message, "bomb in destructor");
    // The runtime goes on.
    assert_eq!(rt.block_on(|| 2).unwrap(), 2);
}

#[test]
fn a_destructor_may_use_thread_locals() {
    corewise::thread_local!(static LATE: RefCell<Option<Tracked>> = const { RefCell::new(None) });
    struct SetsLate(Arc<AtomicUsize>);
    impl Drop for SetsLate {
        fn drop(&mut self) {
            LATE.set(Some(Tracked(self.0.clone())));
        }
    }
    corewise::thread_local!(static EARLY: RefCell<Option<SetsLate>> = const { RefCell::new(None) });
    let rt = one_core();
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    rt.block_on(move || EARLY.set(Some(SetsLate(d)))).unwrap();
    // The value made by the destructor is dropped too, in a later round.
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn values_do_not_leak_into_the_next_thread_of_a_context() {
    let rt = one_core();
    let mut places = std::collections::HashSet::new();
    let mut reused = false;
    // More threads than a core has slots, one at a time: contexts are
    // reused (checked below), and each thread must start with the
    // initial value.
    for i in 1..=200u64 {
        let (seen, place) = Builder::new()
            .core(0)
            .spawn_in(&rt, move || {
                let seen = VALUE.get();
                VALUE.set(i);
                let id = corewise::current().unwrap().to_string();
                // "core C slot S gen G": the context is (C, S).
                let place = id.split(" gen").next().unwrap().to_string();
                (seen, place)
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(seen, 0, "thread {i} saw an earlier thread's value");
        reused |= !places.insert(place);
    }
    assert!(reused, "no slot was reused: {places:?}");
}

#[test]
fn a_value_follows_its_thread_across_cores() {
    let rt = Runtime::builder()
        .min_cores(2)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    if rt.active_cores() < 2 {
        eprintln!("skipping: needs two cores");
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (1..=8u64)
        .map(|t| {
            let stop = stop.clone();
            rt.spawn(move || {
                VALUE.set(t * 1000);
                let mut cores = std::collections::HashSet::new();
                while !stop.load(Ordering::Acquire) {
                    cores.insert(corewise::current_core().unwrap());
                    corewise::sleep(std::time::Duration::from_micros(200));
                    assert_eq!(VALUE.get(), t * 1000, "thread {t} lost its value");
                }
                cores.insert(corewise::current_core().unwrap());
                cores.len()
            })
            .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Releasing core 1 moves its threads to core 0.
    rt.set_max_cores(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt.active_cores() > 1 {
        assert!(std::time::Instant::now() < deadline, "core 1 not released");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Release);
    let moved = hs
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|&n| n > 1)
        .count();
    assert!(moved > 0, "no thread changed cores");
}
