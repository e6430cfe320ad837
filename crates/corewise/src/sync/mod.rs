//! Synchronization for user threads: waiting blocks the user thread, never
//! the core.
//!
//! Everything here is built from one piece, `wait_queue`: a spin-locked
//! list of waiters whose nodes live on the waiting threads' stacks, woken
//! through the runtime's `block`/`signal` pair (or `park`/`unpark` for an OS
//! thread, so the primitives also connect user threads with OS threads).
//! Under `cfg(loom)` waiters are loom threads and the same code is model
//! checked.

pub(crate) mod packet;
pub(crate) mod wait_queue;
pub(crate) mod waiter;

mod channel;
mod condvar;
mod mutex;
mod semaphore;
mod spin;

pub use channel::{
    channel, Receiver, RecvError, RecvTimeoutError, SendError, SendTimeoutError, Sender,
    TryRecvError, TrySendError,
};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{Mutex, MutexGuard};
pub use semaphore::Semaphore;
pub use spin::{SpinLock, SpinLockGuard};
