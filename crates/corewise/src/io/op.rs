//! One blocking-style operation, run the way the calling context allows:
//! through the core's ring, through the core's epoll set, or (on a plain OS
//! thread) as an ordinary system call.
//!
//! An operation is described by raw pointers (the same ones an SQE carries).
//! [`run`] does not return before the kernel is done with them: on the ring
//! the thread waits for the operation's own CQE even after a timeout (the
//! linked timeout cancels the operation, which then completes with
//! `-ECANCELED`) or a cancel (async-cancel, likewise). So a buffer passed in
//! by reference, even one on the caller's stack, is never written after
//! `run` returns, and a stack is never freed under a pending operation.

use super::cancel::{cancelled_error, CancelState};
use super::epoll::Armed;
use super::slab::{OpCell, EVACUATED, IGNORE};
use super::Driver;
use crate::sched::core::Core;
use io_uring::{opcode, squeue, types};
use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// An operation's arguments. Pointers must stay valid until [`run`] returns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// `recv(2)` on a socket.
    Recv {
        fd: RawFd,
        buf: *mut u8,
        len: usize,
        flags: i32,
    },
    /// `send(2)` on a socket (never raises SIGPIPE).
    Send {
        fd: RawFd,
        buf: *const u8,
        len: usize,
    },
    /// `read`/`pread` on a file that cannot be polled.
    Read {
        fd: RawFd,
        buf: *mut u8,
        len: usize,
        off: Option<u64>,
    },
    /// `write`/`pwrite` on a file that cannot be polled.
    Write {
        fd: RawFd,
        buf: *const u8,
        len: usize,
        off: Option<u64>,
    },
    /// `readv`/`preadv`.
    Readv {
        fd: RawFd,
        iov: *const libc::iovec,
        n: usize,
        off: Option<u64>,
        pollable: bool,
    },
    /// `writev`/`pwritev`.
    Writev {
        fd: RawFd,
        iov: *const libc::iovec,
        n: usize,
        off: Option<u64>,
        pollable: bool,
    },
    /// `accept4(2)`, the new socket non-blocking and close-on-exec.
    Accept {
        fd: RawFd,
        addr: *mut libc::sockaddr_storage,
        len: *mut libc::socklen_t,
    },
    /// `recvmsg(2)` with `flags` (`MSG_PEEK` for a peek).
    RecvMsg {
        fd: RawFd,
        msg: *mut libc::msghdr,
        flags: libc::c_int,
    },
    /// `sendmsg(2)`.
    SendMsg { fd: RawFd, msg: *const libc::msghdr },
    /// `fsync`/`fdatasync`.
    Fsync { fd: RawFd, data_only: bool },
    /// Waits until the fd is ready for `events` (poll bits).
    Poll { fd: RawFd, events: u32 },
    /// `openat(AT_FDCWD, path, flags, mode)`, blocking as `open(2)` (a
    /// FIFO's open waits for its peer) on every back end.
    OpenAt {
        path: *const libc::c_char,
        flags: i32,
        mode: u32,
    },
}

/// Largest transfer one read or write asks for (Linux's own limit).
const MAX_RW: usize = 0x7fff_f000;

const NOSIGNAL: i32 = libc::MSG_NOSIGNAL;

impl Kind {
    pub(crate) fn sqe(&self) -> squeue::Entry {
        use types::Fd;
        let cur = u64::MAX; // "use and advance the file position"
        match *self {
            Kind::Recv {
                fd,
                buf,
                len,
                flags,
            } => opcode::Recv::new(Fd(fd), buf, len.min(MAX_RW) as u32)
                .flags(flags)
                .build(),
            Kind::Send { fd, buf, len } => opcode::Send::new(Fd(fd), buf, len.min(MAX_RW) as u32)
                .flags(NOSIGNAL)
                .build(),
            Kind::Read { fd, buf, len, off } => {
                opcode::Read::new(Fd(fd), buf, len.min(MAX_RW) as u32)
                    .offset(off.unwrap_or(cur))
                    .build()
            }
            Kind::Write { fd, buf, len, off } => {
                opcode::Write::new(Fd(fd), buf, len.min(MAX_RW) as u32)
                    .offset(off.unwrap_or(cur))
                    .build()
            }
            Kind::Readv {
                fd, iov, n, off, ..
            } => opcode::Readv::new(Fd(fd), iov, n as u32)
                .offset(off.unwrap_or(cur))
                .build(),
            Kind::Writev {
                fd, iov, n, off, ..
            } => opcode::Writev::new(Fd(fd), iov, n as u32)
                .offset(off.unwrap_or(cur))
                .build(),
            Kind::Accept { fd, addr, len } => opcode::Accept::new(Fd(fd), addr.cast(), len)
                .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
                .build(),
            Kind::RecvMsg { fd, msg, flags } => opcode::RecvMsg::new(Fd(fd), msg)
                .flags(flags as u32)
                .build(),
            Kind::SendMsg { fd, msg } => opcode::SendMsg::new(Fd(fd), msg)
                .flags(NOSIGNAL as u32)
                .build(),
            Kind::Fsync { fd, data_only } => {
                let flags = if data_only {
                    types::FsyncFlags::DATASYNC
                } else {
                    types::FsyncFlags::empty()
                };
                opcode::Fsync::new(Fd(fd)).flags(flags).build()
            }
            Kind::Poll { fd, events } => opcode::PollAdd::new(Fd(fd), events).build(),
            // Always on the kernel's io-wq workers (`IOSQE_ASYNC`): the
            // inline attempt opens as if with `O_NONBLOCK`, so a FIFO's
            // reader would not wait for a writer (its first read then sees
            // the end of the stream) and a writer would fail with `ENXIO`.
            // A worker opens in blocking mode, as `open(2)` does; the user
            // thread waits for the CQE while its core runs others.
            Kind::OpenAt { path, flags, mode } => opcode::OpenAt::new(Fd(libc::AT_FDCWD), path)
                .flags(flags)
                .mode(mode)
                .build()
                .flags(squeue::Flags::ASYNC),
        }
    }

    /// The fd and poll events to wait for when the call would block; `None`
    /// for calls on files that are always "ready" (they block instead).
    fn readiness(&self) -> Option<(RawFd, u32)> {
        let (i, o) = (libc::POLLIN as u32, libc::POLLOUT as u32);
        match *self {
            Kind::Recv { fd, .. } | Kind::Accept { fd, .. } | Kind::RecvMsg { fd, .. } => {
                Some((fd, i))
            }
            Kind::Send { fd, .. } | Kind::SendMsg { fd, .. } => Some((fd, o)),
            Kind::Readv {
                fd, pollable: true, ..
            } => Some((fd, i)),
            Kind::Writev {
                fd, pollable: true, ..
            } => Some((fd, o)),
            Kind::Poll { fd, events } => Some((fd, events)),
            _ => None,
        }
    }

    /// A send on a socket, which [`now`](Self::now) makes with
    /// `MSG_DONTWAIT`: it never blocks, and a socket's send buffer rarely
    /// lacks room, so on the ring back end it is made at once unless it
    /// can join a batch (see [`run_on`]).
    fn sends_without_blocking(&self) -> bool {
        matches!(self, Kind::Send { .. } | Kind::SendMsg { .. })
    }

    /// The call itself: non-blocking for sockets, blocking for files.
    ///
    /// # Safety
    /// The pointers are valid for the call.
    pub(crate) unsafe fn now(&self) -> io::Result<usize> {
        let dw = libc::MSG_DONTWAIT;
        let off = |o: Option<u64>| o.map(|o| o as libc::off_t);
        // SAFETY: (all arms) the caller guarantees the pointers; each call
        // only reads/writes within the lengths given.
        let r: isize = unsafe {
            match *self {
                Kind::Recv {
                    fd,
                    buf,
                    len,
                    flags,
                } => libc::recv(fd, buf.cast(), len, flags | dw),
                Kind::Send { fd, buf, len } => libc::send(fd, buf.cast(), len, NOSIGNAL | dw),
                Kind::Read {
                    fd,
                    buf,
                    len,
                    off: o,
                } => match off(o) {
                    Some(o) => libc::pread(fd, buf.cast(), len, o),
                    None => libc::read(fd, buf.cast(), len),
                },
                Kind::Write {
                    fd,
                    buf,
                    len,
                    off: o,
                } => match off(o) {
                    Some(o) => libc::pwrite(fd, buf.cast(), len, o),
                    None => libc::write(fd, buf.cast(), len),
                },
                Kind::Readv {
                    fd, iov, n, off: o, ..
                } => match off(o) {
                    Some(o) => libc::preadv(fd, iov, n as i32, o),
                    None => libc::readv(fd, iov, n as i32),
                },
                Kind::Writev {
                    fd, iov, n, off: o, ..
                } => match off(o) {
                    Some(o) => libc::pwritev(fd, iov, n as i32, o),
                    None => libc::writev(fd, iov, n as i32),
                },
                Kind::Accept { fd, addr, len } => libc::accept4(
                    fd,
                    addr.cast(),
                    len,
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                ) as isize,
                Kind::RecvMsg { fd, msg, flags } => libc::recvmsg(fd, msg, flags | dw),
                Kind::SendMsg { fd, msg } => libc::sendmsg(fd, msg, NOSIGNAL | dw),
                Kind::Fsync { fd, data_only } => {
                    (if data_only {
                        libc::fdatasync(fd)
                    } else {
                        libc::fsync(fd)
                    }) as isize
                }
                Kind::Poll { fd, events } => {
                    let mut p = libc::pollfd {
                        fd,
                        events: events as i16,
                        revents: 0,
                    };
                    match libc::poll(&mut p, 1, 0) {
                        0 => {
                            *libc::__errno_location() = libc::EAGAIN;
                            -1
                        }
                        n => n as isize,
                    }
                }
                Kind::OpenAt { path, flags, mode } => {
                    libc::openat(libc::AT_FDCWD, path, flags, mode) as isize
                }
            }
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

/// Where the calling thread's I/O goes.
pub(crate) enum Ctx {
    /// A user thread on a core with a ring.
    Ring(&'static Core),
    /// A user thread on a core with an epoll set.
    Epoll(&'static Core),
    /// A plain OS thread (or a core without I/O state).
    Os,
}

/// The calling thread's context, looked up through its slot.
#[inline]
pub(crate) fn ctx() -> Ctx {
    let Some(slot) = crate::sched::current::current_slot() else {
        return Ctx::Os;
    };
    let core = slot.core();
    match core.io.kind() {
        super::KIND_RING => Ctx::Ring(core),
        super::KIND_EPOLL => Ctx::Epoll(core),
        _ => Ctx::Os,
    }
}

/// Runs `kind` to completion, until `deadline` or until cancelled.
///
/// # Safety
/// The pointers in `kind` are valid (for the access the call makes) until
/// this function returns.
pub(crate) unsafe fn run(
    kind: Kind,
    deadline: Option<Instant>,
    cancel: Option<&CancelState>,
) -> io::Result<usize> {
    // SAFETY: per our contract.
    unsafe { run_on(kind, deadline, cancel, Object::default()) }
}

/// What the epoll back end may know of the object an operation works on.
/// The ring and plain OS threads ignore it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Object {
    /// A number no other I/O object of the process has, for an object that
    /// owns its fd from creation to close (0: unknown). With it, the epoll
    /// back end keeps one edge-triggered registration per fd instead of a
    /// one-shot interest re-armed (one `epoll_ctl`) per wait; the number
    /// tells a reused fd number from the object it was registered for.
    pub(crate) ident: u64,
    /// Wait for readiness before the first attempt instead of after an
    /// `EAGAIN`: the caller knows the object was empty a moment ago (a
    /// stream whose last read came back short). Nothing is missed: a
    /// one-shot interest reports data already there when armed, and an
    /// edge that came while nobody waited is remembered (see
    /// [`super::epoll`]); the system call saved is the read that would
    /// have seen `EAGAIN`.
    pub(crate) wait_first: bool,
    /// The operation is a readiness wait (a [`Kind::Poll`]) whose caller
    /// takes a spurious wake-up (`readable`): on epoll the event that ends
    /// the wait is the answer, without a `poll` to confirm it.
    pub(crate) readiness_only: bool,
}

/// Like [`run`], for an operation on `object`.
///
/// # Safety
/// As [`run`].
pub(crate) unsafe fn run_on(
    kind: Kind,
    deadline: Option<Instant>,
    cancel: Option<&CancelState>,
    object: Object,
) -> io::Result<usize> {
    // The core's ring or epoll set is used below: not handed over meanwhile.
    let _entry = crate::sched::handoff::Entry::enter();
    let mut wait_first = object.wait_first;
    // The ring answered `EAGAIN`: wait for readiness before the next try.
    let mut ring_poll = false;
    // Each round looks up the caller's core anew, and a round waits at most
    // once: a thread whose core was released while it waited (or while it
    // was runnable) continues on the core it moved to. A core looked up
    // before a wait is never used after it.
    loop {
        if cancel.is_some_and(|c| c.is_cancelled()) {
            return Err(cancelled_error());
        }
        match ctx() {
            Ctx::Ring(core) => {
                if std::mem::take(&mut ring_poll) {
                    if let Some((fd, events)) = kind.readiness() {
                        let p = Kind::Poll { fd, events };
                        // SAFETY: a poll carries no pointers.
                        let pr = unsafe { ring_wait(core, p.sqe(), deadline, cancel) };
                        if pr < 0 && pr != EVACUATED {
                            return Err(ring_error(pr, deadline, cancel));
                        }
                        continue;
                    }
                }
                if kind.sends_without_blocking() && !ring_batches(core) {
                    // SAFETY: per our contract.
                    match unsafe { kind.now() } {
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                            ) => {}
                        r => return r,
                    }
                }
                // SAFETY: per our contract; ring_wait waits for the CQE.
                let r = unsafe { ring_wait(core, kind.sqe(), deadline, cancel) };
                if r >= 0 {
                    return Ok(r as usize);
                }
                if r == EVACUATED {
                    continue;
                }
                match (-r, kind.readiness()) {
                    (libc::EAGAIN, Some(_)) => ring_poll = true,
                    _ => return Err(ring_error(r, deadline, cancel)),
                }
            }
            Ctx::Epoll(core) => match kind.readiness() {
                Some((fd, ev)) => {
                    if std::mem::take(&mut wait_first) {
                        epoll_ready(core, fd, ev, object.ident, deadline, cancel)?;
                        if object.readiness_only {
                            return Ok(0);
                        }
                        // The wait may have ended because `core` was
                        // released (evacuation) and this thread now runs on
                        // another core: `core` is stale, its epoll set and
                        // records belong to another kernel thread. Look the
                        // core up again before the call (and any wait after
                        // it). Waiting on the old core's set raced with its
                        // dispatcher and, once it stopped polling, lost the
                        // wakeup for good.
                        continue;
                    }
                    // SAFETY: per our contract.
                    match unsafe { kind.now() } {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            epoll_ready(core, fd, ev, object.ident, deadline, cancel)?;
                            if object.readiness_only {
                                return Ok(0);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        r => return r,
                    }
                }
                None => {
                    let job = AssertSend(kind);
                    // SAFETY: `run_scoped` returns only after the job ran,
                    // so the pointers are used within our contract.
                    return unsafe { crate::blocking::run_scoped(move || job.call()) };
                }
            },
            Ctx::Os => {
                // SAFETY: per our contract.
                match unsafe { kind.now() } {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => match kind.readiness() {
                        Some((fd, ev)) => os_ready(fd, ev, deadline, cancel)?,
                        None => return Err(e),
                    },
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    r => return r,
                }
            }
        }
    }
}

/// Whether an entry pushed on `core`'s ring now would share a system call
/// (see [`super::uring::Uring::batches`]). A core without a ring answers
/// yes, so its caller goes on to [`ring_wait`], which reports evacuation.
fn ring_batches(core: &'static Core) -> bool {
    // SAFETY: we run on `core`'s kernel thread (a user thread of the core)
    // and hold no other reference to its driver.
    match unsafe { core.io.driver() } {
        Driver::Ring(u) => u.batches(),
        _ => true,
    }
}

struct AssertSend(Kind);
// SAFETY: the pointers are used only while the owning thread waits in
// `run_scoped`, which it cannot leave before the job is done.
unsafe impl Send for AssertSend {}
impl AssertSend {
    fn call(self) -> io::Result<usize> {
        loop {
            // SAFETY: the pointers are valid while the submitter waits.
            match unsafe { self.0.now() } {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}

fn ring_error(r: i32, deadline: Option<Instant>, cancel: Option<&CancelState>) -> io::Error {
    if r == -libc::ECANCELED || r == -libc::ETIME || r == -libc::EINTR {
        if cancel.is_some_and(|c| c.is_cancelled()) {
            return cancelled_error();
        }
        if deadline.is_some() {
            return io::Error::from(io::ErrorKind::TimedOut);
        }
    }
    io::Error::from_raw_os_error(-r)
}

/// Submits `sqe` through `core`'s ring and waits for its CQE; returns the
/// CQE's result ([`EVACUATED`] when the core was released meanwhile).
///
/// # Safety
/// What `sqe` points to stays valid until this returns (it returns only
/// after the CQE).
pub(crate) unsafe fn ring_wait(
    core: &'static Core,
    sqe: squeue::Entry,
    deadline: Option<Instant>,
    cancel: Option<&CancelState>,
) -> i32 {
    let me = crate::thread::current();
    let cell = OpCell::default();
    // The linked timeout's timespec lives here, on the waiting thread's
    // stack, until the submission (which copies it) has happened.
    let ts = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        types::Timespec::new()
            .sec(left.as_secs())
            .nsec(left.subsec_nanos())
    });
    // SAFETY: we run on `core`'s kernel thread (a user thread of the core)
    // and hold no other reference to its driver.
    let token = match unsafe { core.io.driver() } {
        Driver::Ring(u) => {
            // SAFETY: `cell` outlives the record: we return only once the
            // record has delivered into it.
            let token = unsafe { u.slab.alloc(&cell, me) };
            // SAFETY: the caller keeps the SQE's memory valid until its CQE;
            // `ts` lives until after this thread's next switch (the
            // dispatcher submits before it resumes us).
            unsafe {
                match &ts {
                    Some(ts) => {
                        u.push_linked(
                            &sqe.user_data(token).flags(squeue::Flags::IO_LINK),
                            &opcode::LinkTimeout::new(ts).build().user_data(IGNORE),
                        );
                    }
                    None => u.push(&sqe.user_data(token)),
                }
            }
            token
        }
        _ => return EVACUATED,
    };
    let reg = cancel.map(|c| c.register(core, token));
    // Only the cell is read from here on: if this thread migrates, its old
    // core completed the record (evacuation) before the move.
    let r = loop {
        if let Some(r) = cell.get() {
            break r;
        }
        crate::thread::block();
    };
    drop(reg);
    r
}

/// Waits (blocking the user thread) until `fd` is ready for `events`
/// according to `core`'s epoll set. `Ok` may be spurious (the caller tries
/// its call again).
fn epoll_ready(
    core: &'static Core,
    fd: RawFd,
    events: u32,
    ident: u64,
    deadline: Option<Instant>,
    cancel: Option<&CancelState>,
) -> io::Result<()> {
    let me = crate::thread::current();
    let cell = OpCell::default();
    // SAFETY: we run on `core`'s kernel thread and hold no other reference.
    let token = match unsafe { core.io.driver() } {
        Driver::Epoll(e) => {
            // SAFETY: the record is completed or freed before `cell` dies
            // (below: on timeout we free it, on this same core).
            let token = unsafe { e.slab.alloc(&cell, me) };
            match e.arm(fd, events, ident, token) {
                Ok(Armed::Waiting) => token,
                Ok(Armed::Ready) => {
                    e.slab.free(token);
                    return Ok(());
                }
                Err(err) => {
                    e.slab.free(token);
                    return Err(err);
                }
            }
        }
        _ => return Ok(()),
    };
    let reg = cancel.map(|c| c.register(core, token));
    let r = loop {
        if let Some(r) = cell.get() {
            break Some(r);
        }
        match deadline {
            Some(d) if Instant::now() >= d => break None,
            Some(d) => crate::thread::block_until(d),
            None => crate::thread::block(),
        }
    };
    drop(reg);
    match r {
        Some(r) if r == -libc::ECANCELED => Err(cancelled_error()),
        Some(_) => Ok(()),
        None => {
            let here = crate::sched::current::current_slot().map(|s| s.core());
            if here.is_some_and(|h| std::ptr::eq(h, core)) {
                // Still pending and we run on the core that holds the
                // record: free it here.
                // SAFETY: we run on `core`'s kernel thread.
                if let Driver::Epoll(e) = unsafe { core.io.driver() } {
                    e.slab.free(token);
                }
            } else {
                // The thread left its slot while it waited and now runs on
                // another core: only `core`'s own kernel thread may touch
                // the record, so ask it to cancel (it completes the record,
                // or already did) and wait for the cell before `cell` dies.
                super::cancel::post(core, token);
                while cell.get().is_none() {
                    crate::thread::block();
                }
            }
            if cancel.is_some_and(|c| c.is_cancelled()) {
                Err(cancelled_error())
            } else {
                Err(io::Error::from(io::ErrorKind::TimedOut))
            }
        }
    }
}

/// An OS thread's wait: `poll(2)`, in slices of at most 50 ms when the
/// operation can be cancelled, so a cancel is noticed.
fn os_ready(
    fd: RawFd,
    events: u32,
    deadline: Option<Instant>,
    cancel: Option<&CancelState>,
) -> io::Result<()> {
    loop {
        if cancel.is_some_and(|c| c.is_cancelled()) {
            return Err(cancelled_error());
        }
        let mut ms: i32 = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::from(io::ErrorKind::TimedOut));
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
            None => -1,
        };
        if cancel.is_some() && !(0..=50).contains(&ms) {
            ms = 50;
        }
        let mut p = libc::pollfd {
            fd,
            events: events as i16,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
