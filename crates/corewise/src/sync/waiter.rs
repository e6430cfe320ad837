//! Who waits: a user thread (woken by `signal`) or an OS thread (woken by
//! `unpark`); under loom, a loom thread.
//!
//! A wake may reach its thread after that thread stopped waiting (notifiers
//! wake after unlocking, and a timed-out waiter may leave meanwhile); it then
//! makes the thread's next park return at once, a spurious wakeup, which
//! every park loop here tolerates. Under loom the same token semantics come
//! from a per-thread `loom::sync::Notify` rather than `Thread::unpark`:
//! loom's unpark also resumes a thread blocked in `JoinHandle::join` (or on a
//! loom mutex), which then aborts the model with `assertion failed:
//! state.notified` (tokio-rs/loom#249), although on std such a stale unpark
//! is harmless. loom's `Notify` may also wake spuriously once, so the models
//! check that the park loops tolerate that.

use std::time::Instant;

/// A thread that can be put to sleep and woken.
#[derive(Clone, Debug)]
pub(crate) enum Waiter {
    /// A corewise user thread.
    #[cfg(not(loom))]
    User(crate::thread::ThreadId),
    /// An OS thread.
    #[cfg(not(loom))]
    Os(std::thread::Thread),
    /// A loom thread, through its parker.
    #[cfg(loom)]
    Model(std::sync::Arc<loom::sync::Notify>),
}

#[cfg(loom)]
loom::thread_local! {
    /// The calling loom thread's parker (one waiter: its owner).
    static PARKER: std::sync::Arc<loom::sync::Notify> =
        std::sync::Arc::new(loom::sync::Notify::new());
}

impl Waiter {
    /// The calling thread.
    pub(crate) fn current() -> Self {
        #[cfg(not(loom))]
        {
            match crate::thread::current() {
                Some(id) => Waiter::User(id),
                None => Waiter::Os(std::thread::current()),
            }
        }
        #[cfg(loom)]
        PARKER.with(|p| Waiter::Model(p.clone()))
    }

    /// Wakes the thread (or makes its next park return at once).
    pub(crate) fn wake(&self) {
        match self {
            #[cfg(not(loom))]
            Waiter::User(id) => crate::thread::signal(*id),
            #[cfg(not(loom))]
            Waiter::Os(t) => t.unpark(),
            #[cfg(loom)]
            Waiter::Model(p) => p.notify(),
        }
    }
}

/// Puts the calling thread to sleep until woken (or spuriously).
pub(crate) fn park() {
    #[cfg(not(loom))]
    crate::thread::block();
    #[cfg(loom)]
    PARKER.with(|p| p.wait());
}

/// Like [`park`], also returning at `deadline`. Under loom the deadline is
/// taken to have passed, which makes the models explore the timeout paths.
pub(crate) fn park_until(deadline: Instant) {
    #[cfg(not(loom))]
    crate::thread::block_until(deadline);
    #[cfg(loom)]
    let _ = deadline;
}

/// Whether `deadline` has passed (always, under loom: see [`park_until`]).
pub(crate) fn deadline_passed(deadline: Instant) -> bool {
    #[cfg(loom)]
    let _ = deadline;
    #[cfg(loom)]
    return true;
    #[cfg(not(loom))]
    {
        Instant::now() >= deadline
    }
}
