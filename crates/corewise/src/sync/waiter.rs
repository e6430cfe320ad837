//! Who waits: a user thread (woken by `signal`) or an OS thread (woken by
//! `unpark`); under loom, a loom thread.

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
    /// A loom thread.
    #[cfg(loom)]
    Os(loom::thread::Thread),
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
        Waiter::Os(loom::thread::current())
    }

    /// Wakes the thread (or makes its next park return at once).
    pub(crate) fn wake(&self) {
        match self {
            #[cfg(not(loom))]
            Waiter::User(id) => crate::thread::signal(*id),
            Waiter::Os(t) => t.unpark(),
        }
    }
}

/// Puts the calling thread to sleep until woken (or spuriously).
pub(crate) fn park() {
    #[cfg(not(loom))]
    crate::thread::block();
    #[cfg(loom)]
    loom::thread::park();
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
