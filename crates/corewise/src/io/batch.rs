//! Many operations from one thread, waited for together.
//!
//! On the ring every operation of a batch becomes an SQE at once, so a
//! thread that accepts on several listeners or writes to a thousand
//! connections costs the kernel one `io_uring_enter` per dispatcher pass,
//! not one system call per operation. The batch owns its buffers (heap
//! `Vec`s whose memory does not move), so a pending operation never points
//! into memory the caller could reuse; dropping a batch cancels what is
//! still pending and waits for those completions. Forgetting a batch
//! (`mem::forget`) leaks its buffers, which keeps that safe too.

use super::op::{self, Ctx, Kind};
use super::slab::{OpCell, EVACUATED, IGNORE};
use super::Driver;
use crate::net::{sockaddr_to_std, TcpListener, TcpStream};
use crate::sched::core::Core;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

/// Names one operation of a [`Batch`] until its completion is taken (the
/// batch then reuses the number for a later operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub usize);

/// The outcome of one batch operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum Completion {
    /// An accept: the new connection and its peer.
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    /// A read: bytes read (0 at end of stream) and the buffer, whose first
    /// that many bytes hold them.
    Read(io::Result<usize>, Vec<u8>),
    /// A write: bytes written and the buffer, handed back.
    Written(io::Result<usize>, Vec<u8>),
}

enum Data {
    Accept(Box<(libc::sockaddr_storage, libc::socklen_t)>),
    Read(Vec<u8>),
    Write(Vec<u8>),
}

enum St {
    /// To be submitted (ring) or tried (epoll, OS thread).
    Ready,
    /// Submitted to `core`'s ring, or waiting for readiness in its epoll
    /// set; the result arrives in the entry's cell.
    Waiting(Via, u64),
    /// OS thread: waiting for `poll(2)`.
    Polling,
    Done(io::Result<usize>),
    Taken,
}

#[derive(Clone, Copy)]
enum Via {
    Ring(&'static Core),
    Epoll(&'static Core),
}

struct Entry {
    kind: Kind,
    fd: RawFd,
    st: St,
    /// Ring: the last attempt found the socket not ready; poll first.
    poll_first: bool,
    cell: Box<OpCell>,
    data: Data,
}

/// A set of socket operations submitted together; wait for any or all.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let addr = l.local_addr().unwrap();
///     let clients: Vec<_> = (0..3)
///         .map(|_| corewise::net::TcpStream::connect(addr).unwrap())
///         .collect();
///     let mut accepts = corewise::io::Batch::new();
///     for _ in 0..3 {
///         accepts.accept(&l);
///     }
///     let mut servers = Vec::new();
///     for (_, c) in accepts.wait_all() {
///         if let corewise::io::Completion::Accepted(r) = c {
///             servers.push(r.unwrap().0);
///         }
///     }
///     let mut writes = corewise::io::Batch::new();
///     for s in &servers {
///         writes.write(s, b"hi".to_vec());
///     }
///     assert_eq!(writes.wait_all().len(), 3);
///     for mut c in clients {
///         let mut b = [0u8; 2];
///         c.read_exact(&mut b).unwrap();
///         assert_eq!(&b, b"hi");
///     }
/// }).unwrap();
/// ```
///
/// A batch belongs to the thread that made it (it is not `Send`): its
/// operations live in that thread's core.
pub struct Batch<'a> {
    entries: Vec<Entry>,
    /// Entries whose results were taken: reused by later operations.
    free: Vec<usize>,
    /// Where the next search for a finished entry starts (round robin, so
    /// no operation starves behind busier ones).
    cursor: usize,
    left: usize,
    _fds: PhantomData<(&'a (), *const ())>,
}

impl Default for Batch<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("ops", &self.entries.len())
            .field("pending", &self.left)
            .finish()
    }
}

impl<'a> Batch<'a> {
    /// An empty batch for the calling thread.
    pub fn new() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            cursor: 0,
            left: 0,
            _fds: PhantomData,
        }
    }

    /// Operations not yet taken by a wait.
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether every operation has been taken.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Adds an accept on `listener`.
    pub fn accept(&mut self, listener: &'a TcpListener) -> Token {
        // SAFETY: zeroed sockaddr storage is a valid (empty) address.
        let mut addr: Box<(libc::sockaddr_storage, libc::socklen_t)> =
            Box::new((unsafe { std::mem::zeroed() }, 0));
        addr.1 = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let fd = listener.as_raw_fd();
        let kind = Kind::Accept {
            fd,
            addr: &mut addr.0,
            len: &mut addr.1,
        };
        self.add(kind, fd, Data::Accept(addr))
    }

    /// Adds a read of up to `len` bytes from a socket.
    pub fn read(&mut self, socket: &'a impl AsRawFd, len: usize) -> Token {
        self.read_into(socket, vec![0u8; len])
    }

    /// Adds a read of up to `buf.len()` bytes into `buf` (handed back in
    /// the [`Completion`], so a loop can reuse its buffers).
    pub fn read_into(&mut self, socket: &'a impl AsRawFd, mut buf: Vec<u8>) -> Token {
        let len = buf.len();
        let fd = socket.as_raw_fd();
        let kind = Kind::Recv {
            fd,
            buf: buf.as_mut_ptr(),
            len,
            flags: 0,
        };
        self.add(kind, fd, Data::Read(buf))
    }

    /// Adds a write of `buf` to a socket (one `send`: it may be partial).
    pub fn write(&mut self, socket: &'a impl AsRawFd, buf: Vec<u8>) -> Token {
        let fd = socket.as_raw_fd();
        let kind = Kind::Send {
            fd,
            buf: buf.as_ptr(),
            len: buf.len(),
        };
        self.add(kind, fd, Data::Write(buf))
    }

    fn add(&mut self, kind: Kind, fd: RawFd, data: Data) -> Token {
        let _entry = crate::sched::handoff::Entry::enter();
        let i = match self.free.pop() {
            Some(i) => {
                let e = &mut self.entries[i];
                e.kind = kind;
                e.fd = fd;
                e.st = St::Ready;
                e.poll_first = false;
                e.data = data;
                i
            }
            None => {
                self.entries.push(Entry {
                    kind,
                    fd,
                    st: St::Ready,
                    poll_first: false,
                    cell: Box::default(),
                    data,
                });
                self.entries.len() - 1
            }
        };
        self.left += 1;
        // On the ring the operation goes out with the dispatcher's next
        // submission, together with everything else of this pass.
        if let Ctx::Ring(core) = op::ctx() {
            submit(core, &mut self.entries[i]);
        }
        Token(i)
    }

    /// Waits until every remaining operation has completed and returns
    /// them all, in token order.
    pub fn wait_all(&mut self) -> Vec<(Token, Completion)> {
        let _entry = crate::sched::handoff::Entry::enter();
        let mut out = Vec::with_capacity(self.left);
        while let Ok(Some(c)) = self.wait_any(None) {
            out.push(c);
        }
        out.sort_by_key(|c| c.0);
        out
    }

    /// Waits until one operation completes (or `timeout` passes: an error
    /// of kind `TimedOut`; the operations stay pending). `Ok(None)` when
    /// nothing is left.
    pub fn wait_any(
        &mut self,
        timeout: Option<Duration>,
    ) -> io::Result<Option<(Token, Completion)>> {
        let _entry = crate::sched::handoff::Entry::enter();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.left == 0 {
                return Ok(None);
            }
            self.progress()?;
            let n = self.entries.len();
            let start = self.cursor.min(n);
            let done = (start..n)
                .chain(0..start)
                .find(|&i| matches!(self.entries[i].st, St::Done(_)));
            if let Some(i) = done {
                self.cursor = i + 1;
                return Ok(Some((Token(i), self.take(i))));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(io::Error::from(io::ErrorKind::TimedOut));
            }
            self.wait(deadline)?;
        }
    }

    /// Collects delivered results and starts (again) what is ready, on the
    /// core the thread runs on now.
    fn progress(&mut self) -> io::Result<()> {
        let ctx = op::ctx();
        for e in self.entries.iter_mut() {
            if let St::Waiting(via, _) = e.st {
                if let Some(r) = e.cell.get() {
                    e.st = match via {
                        _ if r == EVACUATED => St::Ready,
                        Via::Ring(_) if r == -libc::EAGAIN => {
                            e.poll_first = true;
                            St::Ready
                        }
                        Via::Ring(_) if r < 0 => St::Done(Err(io::Error::from_raw_os_error(-r))),
                        Via::Ring(_) => St::Done(Ok(r as usize)),
                        Via::Epoll(_) => St::Ready,
                    };
                }
            }
            if !matches!(e.st, St::Ready) {
                continue;
            }
            match ctx {
                Ctx::Ring(core) => submit(core, e),
                Ctx::Epoll(core) => {
                    // SAFETY: the entry owns the buffers the call uses.
                    match unsafe { e.kind.now() } {
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                            e.cell.reset();
                            let me = crate::thread::current();
                            // SAFETY: our core's kernel thread; no other reference.
                            if let Driver::Epoll(ep) = unsafe { core.io.driver() } {
                                // SAFETY: the boxed cell outlives the record
                                // (Drop frees or waits for it).
                                let t = unsafe { ep.slab.alloc(&*e.cell, me) };
                                let (_, ev) = events(&e.kind);
                                // A one-shot interest (ident 0): the batch
                                // does not own the object behind the fd.
                                match ep.arm(e.fd, ev, 0, t) {
                                    Ok(super::epoll::Armed::Waiting) => {
                                        e.st = St::Waiting(Via::Epoll(core), t)
                                    }
                                    Ok(super::epoll::Armed::Ready) => {
                                        ep.slab.free(t);
                                    }
                                    Err(err) => {
                                        ep.slab.free(t);
                                        e.st = St::Done(Err(err));
                                    }
                                }
                            }
                        }
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        r => e.st = St::Done(r),
                    }
                }
                Ctx::Os => {
                    // SAFETY: the entry owns the buffers the call uses.
                    match unsafe { e.kind.now() } {
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => e.st = St::Polling,
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        r => e.st = St::Done(r),
                    }
                }
            }
        }
        Ok(())
    }

    fn wait(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        if crate::thread::current().is_some() {
            match deadline {
                Some(d) => crate::thread::block_until(d),
                None => crate::thread::block(),
            }
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut idx = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            if matches!(e.st, St::Polling) {
                let (ev, _) = events(&e.kind);
                fds.push(libc::pollfd {
                    fd: e.fd,
                    events: ev as i16,
                    revents: 0,
                });
                idx.push(i);
            }
        }
        let ms = deadline.map_or(-1, |d| {
            d.saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, i32::MAX as u128) as i32
        });
        // SAFETY: `fds` is a valid array of its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        for (p, i) in fds.iter().zip(idx) {
            if p.revents != 0 {
                self.entries[i].st = St::Ready;
            }
        }
        Ok(())
    }

    fn take(&mut self, i: usize) -> Completion {
        let e = &mut self.entries[i];
        let St::Done(r) = std::mem::replace(&mut e.st, St::Taken) else {
            unreachable!("take is called on finished entries only")
        };
        self.left -= 1;
        self.free.push(i);
        let data = std::mem::replace(&mut e.data, Data::Read(Vec::new()));
        match data {
            Data::Accept(addr) => Completion::Accepted(r.and_then(|fd| {
                // SAFETY: the kernel returned a new, owned socket fd.
                let s = unsafe { std::net::TcpStream::from_raw_fd(fd as RawFd) };
                let peer = sockaddr_to_std(&addr.0)?;
                Ok((TcpStream::from_nonblocking(s), peer))
            })),
            Data::Read(mut buf) => {
                if let Ok(n) = r {
                    buf.truncate(n);
                }
                Completion::Read(r, buf)
            }
            Data::Write(buf) => Completion::Written(r, buf),
        }
    }
}

/// Writes `e`'s operation into `core`'s ring (after a linked poll when it
/// last found its socket not ready).
fn submit(core: &'static Core, e: &mut Entry) {
    let me = crate::thread::current();
    // SAFETY: we run on `core`'s kernel thread; no other reference.
    let Driver::Ring(u) = (unsafe { core.io.driver() }) else {
        return;
    };
    e.cell.reset();
    // SAFETY: the boxed cell outlives the record: Drop waits for it.
    let t = unsafe { u.slab.alloc(&*e.cell, me) };
    // SAFETY: the buffers are owned by the entry (heap, stable) and
    // outlive the operation (see Drop).
    unsafe {
        if std::mem::take(&mut e.poll_first) {
            let (ev, _) = events(&e.kind);
            let poll = io_uring::opcode::PollAdd::new(io_uring::types::Fd(e.fd), ev)
                .build()
                .user_data(IGNORE)
                .flags(io_uring::squeue::Flags::IO_LINK);
            u.push_linked(&poll, &e.kind.sqe().user_data(t));
        } else {
            u.push(&e.kind.sqe().user_data(t));
        }
    }
    e.st = St::Waiting(Via::Ring(core), t);
}

/// (poll events, epoll events) an entry waits for.
fn events(kind: &Kind) -> (u32, u32) {
    match kind {
        Kind::Send { .. } => (libc::POLLOUT as u32, libc::EPOLLOUT as u32),
        _ => (libc::POLLIN as u32, libc::EPOLLIN as u32),
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let _entry = crate::sched::handoff::Entry::enter();
        // Cancel what is pending, then wait for every result: the buffers
        // must outlive the kernel's use of them.
        for e in &self.entries {
            if let St::Waiting(via, t) = e.st {
                if e.cell.get().is_none() {
                    match via {
                        Via::Ring(core) => super::cancel::post(core, t),
                        // Not delivered, so this thread has not moved:
                        // nothing of the kernel's points at the cell.
                        Via::Epoll(core) => {
                            // SAFETY: we run on `core`'s kernel thread.
                            if let Driver::Epoll(ep) = unsafe { core.io.driver() } {
                                ep.slab.free(t);
                            }
                        }
                    }
                }
            }
        }
        for e in &mut self.entries {
            if let St::Waiting(Via::Ring(_), _) = e.st {
                let r = loop {
                    if let Some(r) = e.cell.get() {
                        break r;
                    }
                    crate::thread::block();
                };
                if r >= 0 && matches!(e.data, Data::Accept(_)) {
                    e.st = St::Done(Ok(r as usize));
                }
            }
            if let (St::Done(Ok(fd)), Data::Accept(_)) = (&e.st, &e.data) {
                // SAFETY: an accepted fd that was never handed out.
                unsafe { libc::close(*fd as RawFd) };
            }
        }
    }
}
