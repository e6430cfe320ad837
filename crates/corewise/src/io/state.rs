//! The per-object half of the I/O path: every socket and file carries an
//! [`IoState`] (its number for the epoll back end, its timeouts, its cancel
//! state) and runs each blocking call through it into [`super::op`].
//!
//! It lives here, beside the back ends it feeds, rather than in one of the
//! modules whose types use it (`net`, `fs`): they share it, and the epoll
//! back end's per-object registration depends on what it records.

use super::op::{self, Kind};
use super::{CancelState, Canceller};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Timeouts and cancel state shared by every I/O object.
#[derive(Debug)]
pub(crate) struct IoState {
    /// This object's number (see [`op::Object::ident`]): every I/O object
    /// owns its fd from creation to drop.
    ident: u64,
    read_ns: AtomicU64,
    write_ns: AtomicU64,
    cancel: OnceLock<Arc<CancelState>>,
    /// The last stream read returned less than it asked for: the socket was
    /// empty then, so the next read waits for readiness first (epoll).
    read_drained: AtomicBool,
}

impl Default for IoState {
    fn default() -> Self {
        /// The last number handed out (0 means "unknown" to the back end).
        static NEXT_IDENT: AtomicU64 = AtomicU64::new(0);
        Self {
            ident: NEXT_IDENT.fetch_add(1, Ordering::Relaxed) + 1,
            read_ns: AtomicU64::new(0),
            write_ns: AtomicU64::new(0),
            cancel: OnceLock::new(),
            read_drained: AtomicBool::new(false),
        }
    }
}

impl IoState {
    fn set(slot: &AtomicU64, d: Option<Duration>) -> io::Result<()> {
        let ns = match d {
            Some(d) if d.is_zero() => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "cannot set a 0 duration timeout",
                ))
            }
            Some(d) => d.as_nanos().min(u64::MAX as u128) as u64,
            None => 0,
        };
        slot.store(ns, Ordering::Relaxed);
        Ok(())
    }

    fn get(slot: &AtomicU64) -> Option<Duration> {
        match slot.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        Self::set(&self.read_ns, d)
    }

    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        Self::set(&self.write_ns, d)
    }

    pub(crate) fn read_timeout(&self) -> Option<Duration> {
        Self::get(&self.read_ns)
    }

    pub(crate) fn write_timeout(&self) -> Option<Duration> {
        Self::get(&self.write_ns)
    }

    pub(crate) fn canceller(&self) -> Canceller {
        Canceller::new(self.cancel.get_or_init(Default::default).clone())
    }

    /// Runs a read-side operation.
    ///
    /// # Safety
    /// As [`op::run`]: the pointers in `kind` are valid until it returns.
    pub(crate) unsafe fn read(&self, kind: Kind) -> io::Result<usize> {
        // SAFETY: per our contract.
        unsafe { self.read_op(kind, false) }
    }

    /// A read-side operation under the read timeout and the cancel state
    /// (`wait_first`: see [`op::Object`]).
    ///
    /// # Safety
    /// As [`op::run`].
    unsafe fn read_op(&self, kind: Kind, wait_first: bool) -> io::Result<usize> {
        let deadline = self.read_timeout().and_then(crate::deadline::after);
        let cancel = self.cancel.get().map(|c| &**c);
        let object = op::Object {
            ident: self.ident,
            wait_first,
            readiness_only: false,
        };
        // SAFETY: per our contract.
        unsafe { op::run_on(kind, deadline, cancel, object) }
    }

    /// Runs a stream read of `len` bytes: like [`read`](Self::read), and a
    /// short result makes the next one wait for readiness before trying
    /// (see [`op::Object`]): per request on a connection that is read
    /// dry each time, one `EAGAIN` system call fewer.
    ///
    /// # Safety
    /// As [`op::run`].
    pub(crate) unsafe fn read_stream(&self, kind: Kind, len: usize) -> io::Result<usize> {
        let wait_first = self.read_drained.load(Ordering::Relaxed);
        // SAFETY: per our contract.
        let r = unsafe { self.read_op(kind, wait_first) };
        if let Ok(n) = r {
            self.read_drained
                .store(n != 0 && n < len, Ordering::Relaxed);
        }
        r
    }

    /// Runs a write-side operation.
    ///
    /// # Safety
    /// As [`op::run`].
    pub(crate) unsafe fn write(&self, kind: Kind) -> io::Result<usize> {
        let deadline = self.write_timeout().and_then(crate::deadline::after);
        let object = op::Object {
            ident: self.ident,
            wait_first: false,
            readiness_only: false,
        };
        // SAFETY: per our contract.
        unsafe { op::run_on(kind, deadline, self.cancel.get().map(|c| &**c), object) }
    }

    /// A scatter read (`readv`) of `fd` into `bufs` (`pollable`: a socket
    /// or pipe, as opposed to a regular file).
    pub(crate) fn read_vectored(
        &self,
        fd: RawFd,
        bufs: &mut [IoSliceMut<'_>],
        pollable: bool,
    ) -> io::Result<usize> {
        let kind = Kind::Readv {
            fd,
            iov: bufs.as_ptr().cast(),
            n: bufs.len().min(1024),
            off: None,
            pollable,
        };
        // SAFETY: `IoSliceMut` is ABI-compatible with `iovec`; the slices
        // are borrowed for the whole call.
        unsafe { self.read(kind) }
    }

    /// A gather write (`writev`) of `bufs` to `fd` (`pollable` as in
    /// [`read_vectored`](Self::read_vectored)).
    pub(crate) fn write_vectored(
        &self,
        fd: RawFd,
        bufs: &[IoSlice<'_>],
        pollable: bool,
    ) -> io::Result<usize> {
        let kind = Kind::Writev {
            fd,
            iov: bufs.as_ptr().cast(),
            n: bufs.len().min(1024),
            off: None,
            pollable,
        };
        // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the slices are
        // borrowed for the whole call.
        unsafe { self.write(kind) }
    }

    /// Waits until `fd` has something to read (data, end of stream, an
    /// error or a pending connection) under the read timeout and the cancel
    /// state, without reading it. The next stream read then tries at once
    /// (the readiness just seen is not waited for again).
    ///
    /// On epoll it may return spuriously (as tokio's `readable`): after a
    /// short read it waits for the next edge without a `poll` first, and
    /// the edge is not confirmed by one either.
    pub(crate) fn readable(&self, fd: RawFd) -> io::Result<()> {
        let deadline = self.read_timeout().and_then(crate::deadline::after);
        let wait_first = self.read_drained.load(Ordering::Relaxed);
        self.poll(fd, libc::POLLIN as u32, deadline, wait_first, true)?;
        self.read_drained.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until `fd` can take more output (or reports an error) under
    /// the write timeout and the cancel state.
    pub(crate) fn writable(&self, fd: RawFd) -> io::Result<()> {
        let deadline = self.write_timeout().and_then(crate::deadline::after);
        self.wait_ready(fd, libc::POLLOUT as u32, deadline)
    }

    /// Waits until `fd` reports one of `events` (`POLL*` bits), under
    /// `deadline` and the cancel state (a non-blocking `connect` finishing).
    pub(crate) fn wait_ready(
        &self,
        fd: RawFd,
        events: u32,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        self.poll(fd, events, deadline, false, false)
    }

    /// A [`Kind::Poll`] of `fd` for `events` on this object (`wait_first`,
    /// `readiness_only`: see [`op::Object`]).
    fn poll(
        &self,
        fd: RawFd,
        events: u32,
        deadline: Option<Instant>,
        wait_first: bool,
        readiness_only: bool,
    ) -> io::Result<()> {
        let kind = Kind::Poll { fd, events };
        let object = op::Object {
            ident: self.ident,
            wait_first,
            readiness_only,
        };
        // SAFETY: a poll carries no pointers.
        unsafe { op::run_on(kind, deadline, self.cancel.get().map(|c| &**c), object) }.map(drop)
    }
}
