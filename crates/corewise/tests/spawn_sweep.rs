//! A spawn into a slot races the slot's dispatcher: the spawner publishes
//! the thread's function and then signals it, and a sweep in between (the
//! dispatcher's periodic one, or the one before it sleeps) takes the
//! published thread, which has no signal yet, for a blocked one and parks
//! it. The spawner's signal must then place it; a spawner that took its
//! thread for one still in its slot left it parked forever, a thread that
//! never ran. The window is a few instructions wide; on a loaded machine
//! the kernel widens it by preempting the spawner there. This test does
//! the same on purpose: a second OS thread interrupts the spawner every
//! 50 µs with a signal whose handler spins for 30 to 70 µs, while the
//! cores, which never spin when idle, sweep each time they go to sleep.
//! Without the fix nearly every run lost a thread within a few rounds.

use corewise::io::IoBackend;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

/// How long the next interruption of the spawner spins (µs).
static STALL_US: AtomicU64 = AtomicU64::new(0);

extern "C" fn stall(_: libc::c_int) {
    // Async-signal-safe: atomics and `clock_gettime`.
    let until = Instant::now() + Duration::from_micros(STALL_US.load(Ordering::Relaxed));
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn install_stall_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no handler" value; the
        // handler, flags and mask are filled in before it is installed, and
        // the handler only spins on the clock.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = stall as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
                0
            );
        }
    });
}

/// Rounds of `THREADS` spawns from one OS thread that is interrupted at
/// random points, for about two seconds; every spawned thread must run.
fn every_spawned_thread_runs(backend: IoBackend) {
    const THREADS: usize = 6000;
    install_stall_handler();
    let start = Instant::now();
    let mut round = 0;
    while round < 3 || start.elapsed() < Duration::from_secs(2) {
        round += 1;
        let rt = Arc::new(
            corewise::Runtime::builder()
                .io_backend(backend)
                .idle_spin(Duration::ZERO)
                .stack_size(64 * 1024)
                .build()
                .unwrap(),
        );
        let ran = Arc::new(AtomicUsize::new(0));
        let spawner = {
            let (rt, ran) = (rt.clone(), ran.clone());
            std::thread::spawn(move || {
                for _ in 0..THREADS {
                    let ran = ran.clone();
                    rt.spawn(move || {
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap();
                }
            })
        };
        let id = spawner.as_pthread_t();
        let mut k = 0u64;
        while !spawner.is_finished() {
            STALL_US.store([30, 50, 70][(k % 3) as usize], Ordering::Relaxed);
            k += 1;
            // SAFETY: `id` names a thread that is not joined yet (its
            // handle is alive), and SIGUSR2 has the spinning handler.
            unsafe { libc::pthread_kill(id, libc::SIGUSR2) };
            std::thread::sleep(Duration::from_micros(50));
        }
        spawner.join().unwrap();
        // Liveness, not speed: a thread that has not run after seconds
        // never will.
        let waited = Instant::now();
        while ran.load(Ordering::Relaxed) < THREADS {
            if waited.elapsed() > Duration::from_secs(10) {
                let stats = rt.stats();
                let ran = ran.load(Ordering::Relaxed);
                // A stranded thread keeps the runtime's shutdown waiting.
                std::mem::forget(rt);
                panic!(
                    "{backend:?}, round {round}: {ran} of {THREADS} threads ran; \
                     {} parked, cores (threads, queued): {:?}",
                    stats.parked,
                    stats
                        .cores
                        .iter()
                        .map(|c| (c.threads, c.queued))
                        .collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn every_spawned_thread_runs_uring() {
    every_spawned_thread_runs(IoBackend::Uring);
}

#[test]
fn every_spawned_thread_runs_epoll() {
    every_spawned_thread_runs(IoBackend::Epoll);
}
