//! I/O that blocks the user thread, never the core, and reaches the kernel
//! the FlexSC way: requests written into shared rings, many submitted with
//! one system call, completions read from memory.
//!
//! Each core owns one io_uring, entered only by the kernel thread that owns
//! the core (`COOP_TASKRUN`, `TASKRUN_FLAG`; without blocking handoff, when
//! that thread never changes, also `SINGLE_ISSUER` and `DEFER_TASKRUN`; as
//! far as the kernel has them). A user thread runs on that
//! kernel thread, so it writes its SQE straight into its core's ring and
//! blocks; the dispatcher submits the pass's SQEs with one
//! `io_uring_enter`, reaps the CQ in memory and signals the waiters (see
//! `uring`). A socket send with no other entry to share that enter with
//! is made at once instead (`MSG_DONTWAIT`; the ring takes it when the
//! buffer is full; see `op::run_on`). The core's idle sleep is a wait in
//! the same ring, woken by completions, by the next timer, and by the idle
//! gate's futex word, which an armed `IORING_OP_FUTEX_WAIT` watches: idle
//! sleep and I/O wait are one wait, and the waker side of
//! `crate::sched::idle` is unchanged.
//!
//! Where io_uring is missing or forbidden (ENOSYS, EPERM from seccomp,
//! `kernel.io_uring_disabled`, or a kernel without the futex opcode) the
//! same API runs on a per-core epoll set with non-blocking calls (see
//! `epoll`); `COREWISE_IO=epoll` or
//! [`Builder::io_backend`](crate::Builder::io_backend) forces it. On a
//! plain OS thread the same types make ordinary system calls.
//!
//! Buffers: a blocking call does not return before its operation's own
//! completion has arrived — after a timeout (linked timeout) or a cancel
//! (async cancel) too — so a borrowed buffer is never written after the
//! call returns and a user thread's stack is never freed under a pending
//! operation. [`Batch`] operations own heap buffers instead, and dropping a
//! batch cancels and waits for what is still pending.

mod batch;
mod cancel;
mod epoll;
pub(crate) mod op;
mod slab;
mod state;
mod uring;

pub use batch::{Batch, Completion, Token};
pub(crate) use cancel::CancelState;
pub use cancel::{is_cancelled, Cancelled, Canceller};
pub(crate) use state::IoState;

use crate::sched::idle::IdleGate;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How the runtime's cores do I/O.
///
/// ```
/// let rt = corewise::Runtime::builder()
///     .io_backend(corewise::io::IoBackend::Epoll)
///     .build()
///     .unwrap();
/// assert_eq!(rt.io_backend(), corewise::io::IoBackend::Epoll);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoBackend {
    /// One io_uring per core (the default where the kernel allows it).
    Uring,
    /// One epoll set per core, non-blocking calls.
    Epoll,
}

impl std::fmt::Display for IoBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoBackend::Uring => "io_uring",
            IoBackend::Epoll => "epoll",
        })
    }
}

/// The back end of the calling user thread's core (`None` on an OS thread,
/// whose I/O is plain system calls).
///
/// ```
/// assert_eq!(corewise::io::backend(), None);
/// let rt = corewise::Runtime::new().unwrap();
/// assert!(rt.block_on(corewise::io::backend).unwrap().is_some());
/// ```
pub fn backend() -> Option<IoBackend> {
    match op::ctx() {
        op::Ctx::Ring(_) => Some(IoBackend::Uring),
        op::Ctx::Epoll(_) => Some(IoBackend::Epoll),
        op::Ctx::Os => None,
    }
}

/// I/O settings of a runtime, from its builder.
#[derive(Debug, Clone, Default)]
pub(crate) struct IoConfig {
    /// Requested back end (`None`: io_uring if it works, else epoll).
    pub(crate) backend: Option<IoBackend>,
    /// SQPOLL mode; `Some(Some(cpu))` pins the poller thread.
    pub(crate) sqpoll: Option<Option<usize>>,
    /// The ring changes hands between kernel threads (blocking handoff):
    /// no single-issuer setup.
    pub(crate) shared_issuer: bool,
}

impl IoConfig {
    fn ring_options(&self) -> uring::RingOptions {
        uring::RingOptions {
            sqpoll: self.sqpoll.map(|c| c.map(|c| c as u32)),
            shared_issuer: self.shared_issuer,
        }
    }

    /// Chooses the back end (environment, builder, probe) and reports a
    /// fallback once.
    pub(crate) fn resolve(&mut self) -> IoBackend {
        let env = std::env::var("COREWISE_IO").ok();
        let forced = match env.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("epoll") => Some(IoBackend::Epoll),
            Some("uring" | "io_uring" | "io-uring") => Some(IoBackend::Uring),
            _ => self.backend,
        };
        let chosen = match forced {
            Some(IoBackend::Epoll) => IoBackend::Epoll,
            _ => match uring::Uring::new(self.ring_options()) {
                Ok(r) => {
                    tracing::debug!(setup = r.setup, "io: io_uring back end");
                    IoBackend::Uring
                }
                Err(e) => {
                    static ONCE: std::sync::Once = std::sync::Once::new();
                    ONCE.call_once(|| {
                        tracing::warn!(error = %e, "io: io_uring unavailable; using epoll");
                    });
                    IoBackend::Epoll
                }
            },
        };
        self.backend = Some(chosen);
        chosen
    }
}

pub(crate) const KIND_NONE: u8 = 0;
pub(crate) const KIND_RING: u8 = 1;
pub(crate) const KIND_EPOLL: u8 = 2;

/// A core's I/O back end. A plain tag (`repr(u8)`): the dispatcher's
/// per-rotation check reads it with one compare, where the niche layout
/// took a dozen instructions to decode.
#[repr(u8)]
pub(crate) enum Driver {
    None,
    Ring(uring::Uring),
    Epoll(epoll::Epoll),
}

/// One core's I/O state: its ring or epoll set (used only by the core's
/// kernel thread) and the queue of cancel requests from other threads.
pub(crate) struct CoreIo {
    kind: AtomicU8,
    driver: UnsafeCell<Driver>,
    cancel_flag: AtomicBool,
    cancels: Mutex<Vec<u64>>,
}

// SAFETY: `driver` is used only on the core's kernel thread (the dispatcher
// and the user threads it runs, one at a time, never across a switch); the
// other fields are atomics or locked.
unsafe impl Sync for CoreIo {}
// SAFETY: as for Sync; the driver is created on the kernel thread that uses
// it and dropped there (`stop`).
unsafe impl Send for CoreIo {}

impl std::fmt::Debug for CoreIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreIo")
            .field("kind", &self.kind())
            .finish()
    }
}

/// The idle gate's futex word. `IdleGate` (outside `cfg(loom)`) is exactly
/// one `AtomicU32`, so the word is at offset 0: a struct's size equals the
/// sum of its fields only without padding, and its one field then starts at
/// offset 0.
fn gate_word(gate: &'static IdleGate) -> &'static AtomicU32 {
    const _: () = assert!(std::mem::size_of::<IdleGate>() == std::mem::size_of::<AtomicU32>());
    const _: () = assert!(std::mem::align_of::<IdleGate>() == std::mem::align_of::<AtomicU32>());
    // SAFETY: same size and alignment, single field at offset 0 (above);
    // the word is an `AtomicU32`, so the reference is to a valid value.
    unsafe { &*(gate as *const IdleGate).cast::<AtomicU32>() }
}

impl CoreIo {
    pub(crate) fn new() -> Self {
        Self {
            kind: AtomicU8::new(KIND_NONE),
            driver: UnsafeCell::new(Driver::None),
            cancel_flag: AtomicBool::new(false),
            cancels: Mutex::new(Vec::new()),
        }
    }

    #[inline]
    pub(crate) fn kind(&self) -> u8 {
        self.kind.load(Ordering::Relaxed)
    }

    /// The driver.
    ///
    /// # Safety
    /// Only the core's kernel thread may call this, and the reference must
    /// be dropped before anything that may switch threads or call this again.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn driver(&self) -> &mut Driver {
        // SAFETY: per the function's contract, no other reference exists.
        unsafe { &mut *self.driver.get() }
    }

    /// Creates the driver. Called by the core's kernel thread (the ring's
    /// single issuer) before its dispatcher first runs.
    pub(crate) fn start(&self, config: &IoConfig, gate: &'static IdleGate) -> std::io::Result<()> {
        let driver = match config.backend {
            Some(IoBackend::Uring) => match uring::Uring::new(config.ring_options()) {
                Ok(u) => Driver::Ring(u),
                Err(e) => {
                    tracing::warn!(error = %e, "io: ring setup failed on this core; using epoll");
                    Driver::Epoll(epoll::Epoll::new(gate_word(gate))?)
                }
            },
            _ => Driver::Epoll(epoll::Epoll::new(gate_word(gate))?),
        };
        let kind = match driver {
            Driver::Ring(_) => KIND_RING,
            Driver::Epoll(_) => KIND_EPOLL,
            Driver::None => KIND_NONE,
        };
        // SAFETY: the kernel thread, before its dispatcher runs.
        unsafe { *self.driver() = driver };
        self.kind.store(kind, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the driver (kernel thread, after its last dispatcher run).
    pub(crate) fn stop(&self) {
        self.kind.store(KIND_NONE, Ordering::Relaxed);
        // SAFETY: the kernel thread; no user thread is left on the core.
        unsafe { *self.driver() = Driver::None };
    }

    /// Queues a cancel request for `token` (any thread); the caller wakes
    /// the core.
    pub(crate) fn queue_cancel(&self, token: u64) {
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(token);
        self.cancel_flag.store(true, Ordering::Release);
    }

    /// Whether cancel requests wait to be forwarded (the sleep re-check:
    /// a request queued after the dispatcher's last pass, while its gate
    /// still read awake, wakes nobody; the dispatcher must see it here,
    /// after announcing its sleep, or it sleeps on it).
    #[inline]
    pub(crate) fn cancels_waiting(&self) -> bool {
        self.cancel_flag.load(Ordering::Acquire)
    }

    /// The dispatcher's per-pass step: submit, reap, forward cancels.
    /// Returns whether it made a thread runnable. With no I/O in flight it
    /// costs a few loads and no system call, inlined into the dispatcher
    /// loop (it runs once per rotation: with two threads yielding to each
    /// other, once every two switches); the work itself is out of line.
    #[inline(always)]
    pub(crate) fn pass(&self) -> bool {
        if self.cancel_flag.load(Ordering::Acquire) {
            self.forward_cancels();
        }
        self.busy() && self.pass_busy()
    }

    /// [`Self::pass`] with operations in flight.
    #[inline(never)]
    fn pass_busy(&self) -> bool {
        // SAFETY: called by the dispatcher on the core's kernel thread.
        match unsafe { self.driver() } {
            Driver::Ring(u) => u.pass() > 0,
            Driver::Epoll(e) => e.pass() > 0,
            Driver::None => false,
        }
    }

    #[cold]
    fn forward_cancels(&self) {
        self.cancel_flag.store(false, Ordering::Relaxed);
        let tokens = std::mem::take(&mut *self.cancels.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: called by the dispatcher on the core's kernel thread.
        match unsafe { self.driver() } {
            Driver::Ring(u) => {
                for t in tokens {
                    let sqe = io_uring::opcode::AsyncCancel::new(t)
                        .build()
                        .user_data(slab::IGNORE);
                    // SAFETY: an async cancel carries no pointers.
                    unsafe { u.push(&sqe) };
                }
            }
            Driver::Epoll(e) => tokens.into_iter().for_each(|t| e.cancel(t)),
            Driver::None => {}
        }
    }

    /// Whether operations are in flight here (the dispatcher's thread).
    #[inline(always)]
    pub(crate) fn busy(&self) -> bool {
        // SAFETY: called by the dispatcher on the core's kernel thread.
        match unsafe { self.driver() } {
            Driver::Ring(u) => u.busy(),
            Driver::Epoll(e) => e.busy(),
            Driver::None => false,
        }
    }

    /// Before the core's threads migrate (the core is being released):
    /// finish or cancel every operation in flight here, so that no thread
    /// waits on this core's ring or epoll set from another core.
    pub(crate) fn evacuate(&self) {
        if self.cancel_flag.load(Ordering::Acquire) {
            self.forward_cancels();
        }
        // SAFETY: called by the dispatcher on the core's kernel thread.
        match unsafe { self.driver() } {
            Driver::Ring(u) => u.evacuate(),
            Driver::Epoll(e) => e.evacuate(),
            Driver::None => {}
        }
    }

    /// The idle sleep, after `prepare_sleep` and an empty re-check. Returns
    /// false when the core has no I/O driver (the caller sleeps on the gate).
    pub(crate) fn idle_wait(&self, gate: &'static IdleGate, timeout: Option<Duration>) -> bool {
        // SAFETY: called by the dispatcher on the core's kernel thread.
        match unsafe { self.driver() } {
            Driver::Ring(u) => u.idle_wait(gate_word(gate), timeout),
            Driver::Epoll(e) => e.idle_wait(timeout),
            Driver::None => return false,
        }
        true
    }
}
