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
///
/// ```
/// use corewise::io::{Batch, Token};
/// let (a, b) = corewise::net::UnixStream::pair().unwrap();
/// let mut batch = Batch::new();
/// let first: Token = batch.write(&a, b"x".to_vec());
/// let second = batch.read(&b, 1);
/// assert_ne!(first, second);
/// // Completions come back under their tokens.
/// let done: Vec<Token> = batch.wait_all().into_iter().map(|(t, _)| t).collect();
/// assert_eq!(done, [first, second]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub usize);

/// The outcome of one batch operation.
///
/// ```
/// use corewise::io::{Batch, Completion};
/// let (a, b) = corewise::net::UnixStream::pair().unwrap();
/// let mut batch = Batch::new();
/// batch.write(&a, b"ping".to_vec());
/// batch.read(&b, 16);
/// for (_, c) in batch.wait_all() {
///     match c {
///         Completion::Written(n, buf) => assert_eq!((n.unwrap(), buf), (4, b"ping".to_vec())),
///         Completion::Read(n, buf) => assert_eq!(&buf[..n.unwrap()], b"ping"),
///         other => panic!("no accept was asked for: {other:?}"),
///     }
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Completion {
    /// An accept: the new connection and its peer.
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    /// A read: bytes read (0 at end of stream) and the buffer, cut to the
    /// bytes read when it succeeded (its capacity kept, so `resize` it
    /// before reading into it again); handed back whole after an error.
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
    ///
    /// ```
    /// let batch = corewise::io::Batch::new();
    /// assert!(batch.is_empty());
    /// assert_eq!(batch.len(), 0);
    /// ```
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
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// let mut batch = corewise::io::Batch::new();
    /// batch.write(&a, b"1".to_vec());
    /// batch.read(&b, 1);
    /// assert_eq!(batch.len(), 2);
    /// batch.wait_any(None).unwrap();
    /// assert_eq!(batch.len(), 1); // one taken, one left
    /// ```
    pub fn len(&self) -> usize {
        self.left
    }

    /// Whether every operation has been taken.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// let mut batch = corewise::io::Batch::new();
    /// batch.write(&a, b"1".to_vec());
    /// assert!(!batch.is_empty());
    /// batch.wait_all();
    /// assert!(batch.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Adds an accept on `listener`.
    ///
    /// ```
    /// use corewise::io::{Batch, Completion};
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    ///     let client = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    ///     let mut batch = Batch::new();
    ///     batch.accept(&l);
    ///     let (_, c) = batch.wait_any(None).unwrap().unwrap();
    ///     let Completion::Accepted(Ok((_server, peer))) = c else { panic!("{c:?}") };
    ///     assert_eq!(peer, client.local_addr().unwrap());
    /// })
    /// .unwrap();
    /// ```
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
    ///
    /// ```
    /// use corewise::io::{Batch, Completion};
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let (a, b) = corewise::net::UnixStream::pair().unwrap();
    ///     let (c, d) = corewise::net::UnixStream::pair().unwrap();
    ///     let mut batch = Batch::new();
    ///     let from_b = batch.read(&b, 8);
    ///     batch.read(&d, 8);
    ///     c.write(b"d first").unwrap(); // only d has data: its read completes first
    ///     let (t, done) = batch.wait_any(None).unwrap().unwrap();
    ///     assert_ne!(t, from_b);
    ///     let Completion::Read(Ok(n), buf) = done else { panic!("{done:?}") };
    ///     assert_eq!(&buf[..n], b"d first");
    ///     a.write(b"b").unwrap();
    ///     assert_eq!(batch.wait_all().len(), 1);
    /// })
    /// .unwrap();
    /// ```
    pub fn read(&mut self, socket: &'a impl AsRawFd, len: usize) -> Token {
        self.read_into(socket, vec![0u8; len])
    }

    /// Adds a read of up to `buf.len()` bytes into `buf` (handed back in
    /// the [`Completion`], so a loop can reuse its buffers).
    ///
    /// ```
    /// use corewise::io::{Batch, Completion};
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// let mut buf = vec![0u8; 64]; // reads up to its length
    /// for msg in [&b"one"[..], b"three"] {
    ///     a.write(msg).unwrap();
    ///     let mut batch = Batch::new();
    ///     batch.read_into(&b, buf);
    ///     let (_, done) = batch.wait_any(None).unwrap().unwrap();
    ///     let Completion::Read(Ok(n), back) = done else { panic!("{done:?}") };
    ///     assert_eq!(&back[..n], msg);
    ///     assert_eq!(back.len(), n); // shortened to what was read
    ///     buf = back;
    ///     buf.resize(64, 0); // the same allocation for the next read
    /// }
    /// ```
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
    ///
    /// ```
    /// use corewise::io::{Batch, Completion};
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// let mut batch = Batch::new();
    /// batch.write(&a, b"hello".to_vec());
    /// let (_, done) = batch.wait_any(None).unwrap().unwrap();
    /// let Completion::Written(Ok(n), buf) = done else { panic!("{done:?}") };
    /// assert_eq!((n, buf.as_slice()), (5, &b"hello"[..]));
    /// let mut got = [0u8; 5];
    /// assert_eq!(b.read(&mut got).unwrap(), 5);
    /// assert_eq!(&got, b"hello");
    /// ```
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
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let pairs: Vec<_> = (0..3).map(|_| corewise::net::UnixStream::pair().unwrap()).collect();
    ///     let mut batch = corewise::io::Batch::new();
    ///     for (a, _) in &pairs {
    ///         batch.write(a, b"x".to_vec());
    ///     }
    ///     let done = batch.wait_all();
    ///     assert_eq!(done.len(), 3);
    ///     assert!(done.windows(2).all(|w| w[0].0 < w[1].0)); // in token order
    ///     assert!(batch.is_empty());
    /// })
    /// .unwrap();
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// let (_a, b) = corewise::net::UnixStream::pair().unwrap();
    /// let mut batch = corewise::io::Batch::new();
    /// batch.read(&b, 1); // nothing is ever written
    /// let err = batch.wait_any(Some(Duration::from_millis(5))).unwrap_err();
    /// assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    /// assert_eq!(batch.len(), 1); // still pending
    /// ```
    pub fn wait_any(
        &mut self,
        timeout: Option<Duration>,
    ) -> io::Result<Option<(Token, Completion)>> {
        let _entry = crate::sched::handoff::Entry::enter();
        let deadline = timeout.and_then(crate::deadline::after);
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
