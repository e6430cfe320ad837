//! Idle sleep: a core with nothing to run sleeps in the kernel, Fred-style.
//!
//! Arachne busy-polls every granted core; on a shared machine that burns a
//! whole CPU per idle core. Here the dispatcher spins for a short budget and
//! then sleeps on a futex (with the next timer as its timeout). A waker
//! (`signal`, `spawn`) publishes its work first and then calls
//! [`IdleGate::wake`]; the sleeper announces itself with
//! [`IdleGate::prepare_sleep`] and re-checks for work before it sleeps. Each
//! side writes its own word (the work, the gate), then a `SeqCst` fence, then
//! reads the other's word: the Dekker pattern, so one of them always sees
//! the other and no wakeup is lost. (Fences rather than `SeqCst` accesses,
//! which loom treats as acquire/release and so could not verify.) While the core is awake, `wake` costs one load of
//! a line that the core never writes, so it stays cheap on the hot path.

use crate::shim::{fence, AtomicU32, Ordering};
use std::time::Duration;

/// The gate word of a core that is running or spinning.
pub(crate) const AWAKE: u32 = 0;
/// The gate word of a core that sleeps (or is about to) in the kernel;
/// the I/O back ends wait on the same word with the same value.
pub(crate) const SLEEPING: u32 = 1;

/// The sleep/wake word of one core.
#[derive(Debug)]
pub(crate) struct IdleGate {
    state: AtomicU32,
    #[cfg(loom)]
    futex: loom_futex::Futex,
}

impl IdleGate {
    /// A gate for an awake core.
    pub(crate) fn new() -> Self {
        Self {
            state: AtomicU32::new(AWAKE),
            #[cfg(loom)]
            futex: loom_futex::Futex::new(),
        }
    }

    /// The dispatcher is about to sleep: after this it must look for work once
    /// more and then call [`sleep`](Self::sleep) or
    /// [`cancel_sleep`](Self::cancel_sleep).
    pub(crate) fn prepare_sleep(&self) {
        self.state.store(SLEEPING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The re-check found work: stay awake.
    pub(crate) fn cancel_sleep(&self) {
        self.state.store(AWAKE, Ordering::Relaxed);
    }

    /// Sleeps until [`wake`](Self::wake) or the timeout. Returns at once if a
    /// wake came after [`prepare_sleep`](Self::prepare_sleep).
    pub(crate) fn sleep(&self, timeout: Option<Duration>) {
        #[cfg(not(loom))]
        {
            let ts = timeout.map(|d| rustix::time::Timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: d.subsec_nanos() as _,
            });
            // EAGAIN (already woken), EINTR and ETIMEDOUT all mean "look again".
            let _ = rustix::thread::futex::wait(
                &self.state,
                rustix::thread::futex::Flags::PRIVATE,
                SLEEPING,
                ts.as_ref(),
            );
        }
        #[cfg(loom)]
        {
            let _ = timeout;
            self.futex.wait(&self.state, SLEEPING);
        }
        self.state.store(AWAKE, Ordering::Relaxed);
    }

    /// Wakes the core if it sleeps. Call it after publishing the work.
    #[inline]
    pub(crate) fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::Relaxed) == SLEEPING
            && self.state.swap(AWAKE, Ordering::SeqCst) == SLEEPING
        {
            #[cfg(not(loom))]
            let _ =
                rustix::thread::futex::wake(&self.state, rustix::thread::futex::Flags::PRIVATE, 1);
            #[cfg(loom)]
            self.futex.wake();
        }
    }

    /// [`wake`](Self::wake) for a caller whose last write was a locked
    /// read-modify-write (the wakeup word's swap). On x86-64 that
    /// instruction is already a full fence, so only the compiler is fenced;
    /// elsewhere (and in the loom models) this is `wake`.
    #[inline]
    pub(crate) fn wake_after_rmw(&self) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            if self.state.load(Ordering::Relaxed) == SLEEPING
                && self.state.swap(AWAKE, Ordering::SeqCst) == SLEEPING
            {
                let _ = rustix::thread::futex::wake(
                    &self.state,
                    rustix::thread::futex::Flags::PRIVATE,
                    1,
                );
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        self.wake();
    }

    /// Whether the core is asleep (or about to be); for statistics and tests.
    #[cfg(not(loom))]
    pub(crate) fn is_sleeping(&self) -> bool {
        self.state.load(Ordering::Relaxed) == SLEEPING
    }
}

/// A futex for loom: the kernel's "compare and sleep" made of a mutex and a
/// condition variable, so the models check the gate's real protocol.
#[cfg(loom)]
mod loom_futex {
    use loom::sync::atomic::AtomicU32;
    use loom::sync::{Condvar, Mutex};
    use std::sync::atomic::Ordering;

    #[derive(Debug)]
    pub(crate) struct Futex {
        lock: Mutex<()>,
        cv: Condvar,
    }

    impl Futex {
        pub(crate) fn new() -> Self {
            Self {
                lock: Mutex::new(()),
                cv: Condvar::new(),
            }
        }

        pub(crate) fn wait(&self, word: &AtomicU32, expected: u32) {
            let guard = self.lock.lock().unwrap();
            if word.load(Ordering::SeqCst) == expected {
                drop(self.cv.wait(guard).unwrap());
            }
        }

        pub(crate) fn wake(&self) {
            let _guard = self.lock.lock().unwrap();
            self.cv.notify_all();
        }
    }
}
