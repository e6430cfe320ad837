//! Scoped threads (`corewise::scope`, `Runtime::scope`) and the entry point
//! (`corewise::run`, `Builder::run`) on real cores.

use corewise::{RunError, Runtime, SpawnError};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn runtime() -> Runtime {
    Runtime::builder()
        .neighbour_awareness(None)
        .build()
        .expect("runtime")
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[test]
fn threads_borrow_the_stack_and_are_joined_before_scope_returns() {
    let rt = runtime();
    rt.block_on(|| {
        let mut slots = vec![0u64; 16];
        let finished = AtomicUsize::new(0);
        corewise::scope(|s| {
            for (i, slot) in slots.iter_mut().enumerate() {
                let finished = &finished;
                // Not joined: the scope joins them.
                s.spawn(move || {
                    corewise::sleep(Duration::from_millis(1 + i as u64 % 3));
                    *slot = i as u64 * i as u64;
                    finished.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            }
        });
        assert_eq!(finished.load(Ordering::SeqCst), 16);
        slots.push(0);
        assert_eq!(
            slots[..16],
            (0..16u64).map(|i| i * i).collect::<Vec<_>>()[..]
        );
    })
    .unwrap();
}

#[test]
fn a_runtime_scope_works_from_an_os_thread_and_nests() {
    let rt = runtime();
    let text = String::from("corewise");
    let total = rt.scope(|s| {
        let outer = s
            .spawn(|| {
                // A scoped thread spawns into the same scope.
                let inner = s.spawn(|| text.len()).unwrap();
                inner.join().unwrap() * 2
            })
            .unwrap();
        outer.join().unwrap()
    });
    assert_eq!(total, 16);
}

#[test]
fn corewise_scope_outside_a_runtime_cannot_spawn() {
    let r = corewise::scope(|s| s.spawn(|| 1).map(|_| ()));
    assert_eq!(r.unwrap_err(), SpawnError::NotInRuntime);
}

#[test]
fn an_unjoined_panic_propagates_with_its_payload_after_all_threads_end() {
    let rt = runtime();
    let slow_done = AtomicBool::new(false);
    let r = catch_unwind(AssertUnwindSafe(|| {
        rt.scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                slow_done.store(true, Ordering::SeqCst);
            })
            .unwrap();
            s.spawn(|| panic!("scoped boom")).unwrap();
        })
    }));
    let payload = r.expect_err("the scope must panic");
    assert_eq!(panic_message(&*payload), "scoped boom");
    assert!(
        slow_done.load(Ordering::SeqCst),
        "scope returned before a thread ended"
    );
}

#[test]
fn a_joined_panic_is_the_callers_to_handle() {
    let rt = runtime();
    let msg = rt.scope(|s| {
        let h = s.spawn(|| -> () { panic!("handled") }).unwrap();
        h.join().unwrap_err().message
    });
    assert_eq!(msg, "handled");
}

#[test]
fn a_panic_in_the_scope_closure_propagates_after_the_threads_end() {
    let rt = runtime();
    let done = AtomicBool::new(false);
    let r = catch_unwind(AssertUnwindSafe(|| {
        rt.scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                done.store(true, Ordering::SeqCst);
            })
            .unwrap();
            panic!("closure boom");
        })
    }));
    assert_eq!(panic_message(&*r.unwrap_err()), "closure boom");
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn an_unjoined_result_is_dropped_before_the_scope_ends() {
    struct Marks<'a>(&'a AtomicBool);
    impl Drop for Marks<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let rt = runtime();
    let dropped = AtomicBool::new(false);
    rt.scope(|s| {
        let h = s.spawn(|| Marks(&dropped)).unwrap();
        drop(h);
    });
    assert!(dropped.load(Ordering::SeqCst));
}

#[test]
fn run_returns_the_result_and_borrows() {
    let words = [String::from("core"), String::from("wise")];
    let n = corewise::run(|| {
        assert!(corewise::current().is_some());
        let h = corewise::spawn(|| 1).unwrap();
        words.iter().map(|w| w.len()).sum::<usize>() + h.join().unwrap()
    })
    .unwrap();
    assert_eq!(n, 9);
    let v = Runtime::builder().max_cores(1).run(|| 5).unwrap();
    assert_eq!(v, 5);
}

#[test]
fn run_reports_a_panic_and_a_bad_setting() {
    match corewise::run(|| -> u8 { panic!("in run") }) {
        Err(RunError::Join(e)) => assert_eq!(e.message, "in run"),
        other => panic!("expected a join error, got {other:?}"),
    }
    match Runtime::builder().stack_size(1).run(|| 1) {
        Err(RunError::Build(corewise::BuildError::Invalid(_))) => {}
        other => panic!("expected a build error, got {other:?}"),
    }
}

#[test]
fn spawn_outside_a_runtime_says_how_to_start_one() {
    let err = corewise::spawn(|| 1).unwrap_err();
    assert_eq!(err, SpawnError::NotInRuntime);
    let msg = err.to_string();
    assert!(msg.contains("corewise::run"), "{msg}");
    assert!(msg.contains("Runtime::new"), "{msg}");
}
