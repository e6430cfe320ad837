//! Cancelling another thread's pending operation.
//!
//! Only a core's own kernel thread may write to its ring, so a cancel from
//! anywhere else is a request: the canceller marks the object cancelled,
//! then for each operation registered on it queues the operation's token on
//! that operation's core and wakes the core; the core's dispatcher turns the
//! token into an `IORING_OP_ASYNC_CANCEL` (ring) or completes the waiter
//! (epoll). Marking first and registering before looking at the mark (each
//! side fenced) means an operation that starts during a cancel either sees
//! the mark or is seen by the canceller.

use crate::sched::core::Core;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The error of an operation that was cancelled: `io::ErrorKind::Other`
/// with this as its inner error (see [`is_cancelled`]).
///
/// ```
/// use corewise::io::{is_cancelled, Cancelled};
/// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
/// a.canceller().cancel();
/// let err = a.read(&mut [0u8; 1]).unwrap_err();
/// assert!(is_cancelled(&err));
/// assert_eq!(err.get_ref().unwrap().downcast_ref::<Cancelled>(), Some(&Cancelled));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("operation cancelled")]
pub struct Cancelled;

pub(crate) fn cancelled_error() -> std::io::Error {
    std::io::Error::other(Cancelled)
}

/// Whether `e` reports a cancelled operation.
///
/// ```
/// let e = std::io::Error::other(corewise::io::Cancelled);
/// assert!(corewise::io::is_cancelled(&e));
/// assert!(!corewise::io::is_cancelled(&std::io::Error::from(std::io::ErrorKind::TimedOut)));
/// ```
pub fn is_cancelled(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Cancelled>())
}

/// Per-object cancel state, created when the first [`Canceller`] is.
#[derive(Debug, Default)]
pub(crate) struct CancelState {
    cancelled: AtomicBool,
    pending: Mutex<Vec<(usize, u64)>>,
}

impl CancelState {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Registers a pending operation (`token` on `core`) until the returned
    /// guard drops.
    pub(crate) fn register(&self, core: &'static Core, token: u64) -> Registration<'_> {
        let key = (core as *const Core as usize, token);
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key);
        fence(Ordering::SeqCst);
        if self.cancelled.load(Ordering::Relaxed) {
            post(core, token);
        }
        Registration { state: self, key }
    }

    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for &(core, token) in pending.iter() {
            // SAFETY: the key was made from a `&'static Core` in `register`.
            post(unsafe { &*(core as *const Core) }, token);
        }
    }
}

/// Keeps an operation registered for cancellation while it is pending.
pub(crate) struct Registration<'a> {
    state: &'a CancelState,
    key: (usize, u64),
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut p = self.state.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = p.iter().position(|k| *k == self.key) {
            p.swap_remove(i);
        }
    }
}

pub(crate) fn post(core: &'static Core, token: u64) {
    core.io.queue_cancel(token);
    core.gate.wake();
}

/// Cancels the blocking operations of one I/O object from any thread.
///
/// `cancel` makes every operation pending on the object return an error for
/// which [`is_cancelled`] is true, and so does every later operation (the
/// mark is sticky). The kernel's operation is cancelled too
/// (`IORING_OP_ASYNC_CANCEL`), and the waiting thread returns only once its
/// operation's completion has arrived, so its buffer is never written
/// afterwards. Operations already pending when the object's first
/// `Canceller` was created are not covered: create it up front. On a plain
/// OS thread a cancel is noticed within 50 ms.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let c = l.canceller();
///     let h = corewise::spawn(move || l.accept().map(|_| ())).unwrap();
///     corewise::sleep(std::time::Duration::from_millis(5));
///     c.cancel();
///     let e = h.join().unwrap().unwrap_err();
///     assert!(corewise::io::is_cancelled(&e));
/// }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Canceller {
    state: Arc<CancelState>,
}

impl Canceller {
    pub(crate) fn new(state: Arc<CancelState>) -> Self {
        Self { state }
    }

    /// Cancels pending and future operations on the object.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// let c = a.canceller(); // before the read starts
    /// let reader = rt.spawn(move || a.read(&mut [0u8; 1])).unwrap();
    /// std::thread::sleep(Duration::from_millis(2));
    /// c.cancel(); // the blocked read returns
    /// assert!(corewise::io::is_cancelled(&reader.join().unwrap().unwrap_err()));
    /// ```
    pub fn cancel(&self) {
        self.state.cancel();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// let c = a.canceller();
    /// assert!(!c.is_cancelled());
    /// c.clone().cancel(); // clones share the mark
    /// assert!(c.is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.state.is_cancelled()
    }
}
