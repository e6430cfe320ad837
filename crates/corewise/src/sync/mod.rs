//! Synchronization for user threads: waiting blocks the user thread, never
//! the core.
//!
//! Everything here is built from one piece, `wait_queue`: a spin-locked
//! list of waiters whose nodes live in the waiting threads' slots (an OS
//! thread's on its stack), woken
//! through the runtime's `block`/`signal` pair (or `park`/`unpark` for an OS
//! thread, so the primitives also connect user threads with OS threads).
//! Under `cfg(loom)` waiters are loom threads and the same code is model
//! checked.
//!
//! # Differences from `std::sync`
//!
//! The types have std's names and, where it makes sense, its signatures.
//! Where they differ:
//!
//! - No poisoning. [`Mutex::lock`], [`RwLock::read`] and [`RwLock::write`]
//!   return the guard itself, not a `LockResult`; [`Condvar::wait`] takes
//!   and returns the guard. A panic while a guard is held releases the
//!   lock (the value may be half updated). `try_lock`, `try_read` and
//!   `try_write` return an `Option`.
//! - Timed acquisition std lacks: [`Mutex::try_lock_for`],
//!   [`RwLock::try_read_for`], [`RwLock::try_write_for`].
//! - [`RwLock`] prefers writers: a waiting writer holds new readers back,
//!   so readers cannot starve it. A thread that takes a read lock it
//!   already holds can then deadlock behind a waiting writer (std allows
//!   the same on some platforms): do not nest read locks.
//! - [`Once`] is not poisoned when its function panics: the next
//!   `call_once` runs its own (as [`OnceLock`] does); there is no
//!   `call_once_force`. [`OnceLock`] has `get`, `get_or_init`, `set` and
//!   `get_mut`.
//! - [`Barrier`] and [`BarrierWaitResult`] behave as std's.
//! - [`channel()`] is bounded (std's `sync_channel`; a capacity of 0 holds
//!   one item, not a rendezvous); its [`Receiver`] can be cloned, and
//!   iterates as std's (`iter`, `try_iter`, `for x in rx`).
//! - Waiting blocks the user thread, never its core; the same values work
//!   between user threads and OS threads.

pub(crate) mod packet;
pub(crate) mod wait_queue;
pub(crate) mod waiter;

mod barrier;
mod channel;
mod condvar;
mod mutex;
mod notify_hint;
mod once;
mod rwlock;
mod semaphore;
mod spin;

pub use barrier::{Barrier, BarrierWaitResult};
pub use channel::{
    channel, IntoIter, Iter, Receiver, RecvError, RecvTimeoutError, SendError, SendTimeoutError,
    Sender, TryIter, TryRecvError, TrySendError,
};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{Mutex, MutexGuard};
pub use once::{Once, OnceLock};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::Semaphore;
pub use spin::{SpinLock, SpinLockGuard};
