//! Sockets whose blocking calls block the user thread, not its core.
//!
//! The types mirror `std::net` (and `std::os::unix::net`): same names, same
//! methods, `std::io::Read`/`Write` for the streams and for references to
//! them. Under the hood every socket is non-blocking and each call goes
//! through the calling core's ring (or epoll set), see [`crate::io`]; on a
//! plain OS thread the same call is an ordinary system call plus `poll(2)`.
//!
//! Every blocking call honours the object's timeouts (a linked timeout on
//! the ring; the error kind is `TimedOut`) and can be cancelled from another
//! thread through a [`Canceller`]. `shutdown` from another thread wakes a
//! blocked reader with end-of-stream, as with std.

use crate::io::op::{self, Kind};
use crate::io::{CancelState, Canceller};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Listen backlog of listeners made here (the kernel caps it at somaxconn).
const BACKLOG: i32 = 4096;

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
        let deadline = self.read_timeout().map(|d| Instant::now() + d);
        let cancel = self.cancel.get().map(|c| &**c);
        let object = op::Object {
            ident: self.ident,
            wait_first,
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
        let deadline = self.write_timeout().map(|d| Instant::now() + d);
        let object = op::Object {
            ident: self.ident,
            wait_first: false,
        };
        // SAFETY: per our contract.
        unsafe { op::run_on(kind, deadline, self.cancel.get().map(|c| &**c), object) }
    }
}

/// A `SocketAddr` from a kernel socket address.
pub(crate) fn sockaddr_to_std(s: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match s.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in, which fits.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Ok(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6, which fits.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Ok(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an IP socket address",
        )),
    }
}

/// The kernel form of `a`.
fn std_to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_in fits in the storage, which is aligned for it.
            let p = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            p.sin_family = libc::AF_INET as _;
            p.sin_port = v4.port().to_be();
            p.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let p = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            p.sin6_family = libc::AF_INET6 as _;
            p.sin6_port = v6.port().to_be();
            p.sin6_addr.s6_addr = v6.ip().octets();
            p.sin6_flowinfo = v6.flowinfo();
            p.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

fn family(a: &SocketAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    }
}

fn new_socket(af: AddressFamily, ty: SocketType) -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        af,
        ty,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Tries each address of `addrs` with `f`, returning the first success or
/// the last error.
fn each_addr<T>(
    addrs: impl ToSocketAddrs,
    mut f: impl FnMut(&SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in addrs.to_socket_addrs()? {
        match f(&a) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

/// Waits for a non-blocking `connect` to finish and reports its outcome.
fn finish_connect(fd: &OwnedFd, state: &IoState, deadline: Option<Instant>) -> io::Result<()> {
    let kind = Kind::Poll {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT as u32,
    };
    let object = op::Object {
        ident: state.ident,
        wait_first: false,
    };
    // SAFETY: a poll carries no pointers.
    unsafe { op::run_on(kind, deadline, state.cancel.get().map(|c| &**c), object) }?;
    match rustix::net::sockopt::socket_error(fd)? {
        Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn connect_fd(
    fd: &OwnedFd,
    addr: &impl rustix::net::addr::SocketAddrArg,
    state: &IoState,
    deadline: Option<Instant>,
) -> io::Result<()> {
    match rustix::net::connect(fd, addr) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::INPROGRESS) | Err(rustix::io::Errno::AGAIN) => {
            finish_connect(fd, state, deadline)
        }
        Err(e) => Err(e.into()),
    }
}

/// Shared stream methods of [`TcpStream`] and [`UnixStream`].
macro_rules! stream_methods {
    ($t:ty) => {
        impl $t {
            /// Reads into `buf`; `Ok(0)` at end of stream.
            pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
                let kind = Kind::Recv {
                    fd: self.as_raw_fd(),
                    buf: buf.as_mut_ptr(),
                    len: buf.len(),
                    flags: 0,
                };
                // SAFETY: `buf` is borrowed for the whole call, which
                // returns only after the kernel is done with it.
                unsafe { self.state.read_stream(kind, buf.len()) }
            }

            /// Reads without removing the data from the queue.
            pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
                let kind = Kind::Recv {
                    fd: self.as_raw_fd(),
                    buf: buf.as_mut_ptr(),
                    len: buf.len(),
                    flags: libc::MSG_PEEK,
                };
                // SAFETY: as in `read`.
                unsafe { self.state.read(kind) }
            }

            /// Writes some of `buf`; returns how much.
            pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
                let kind = Kind::Send {
                    fd: self.as_raw_fd(),
                    buf: buf.as_ptr(),
                    len: buf.len(),
                };
                // SAFETY: as in `read`.
                unsafe { self.state.write(kind) }
            }

            /// Scatter read (`readv`).
            pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                let kind = Kind::Readv {
                    fd: self.as_raw_fd(),
                    iov: bufs.as_ptr().cast(),
                    n: bufs.len().min(1024),
                    off: None,
                    pollable: true,
                };
                // SAFETY: `IoSliceMut` is ABI-compatible with `iovec`; the
                // slices are borrowed for the whole call.
                unsafe { self.state.read(kind) }
            }

            /// Gather write (`writev`).
            pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                let kind = Kind::Writev {
                    fd: self.as_raw_fd(),
                    iov: bufs.as_ptr().cast(),
                    n: bufs.len().min(1024),
                    off: None,
                    pollable: true,
                };
                // SAFETY: `IoSlice` is ABI-compatible with `iovec`.
                unsafe { self.state.write(kind) }
            }

            /// Shuts down the read, write, or both halves. From another
            /// thread it wakes a blocked reader with end-of-stream.
            pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                self.sock.shutdown(how)
            }

            /// Timeout of each read (`None`: wait forever). Zero is an error.
            pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
                self.state.set_read_timeout(d)
            }

            /// Timeout of each write (`None`: wait forever). Zero is an error.
            pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
                self.state.set_write_timeout(d)
            }

            /// The read timeout.
            pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
                Ok(self.state.read_timeout())
            }

            /// The write timeout.
            pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
                Ok(self.state.write_timeout())
            }

            /// A handle that cancels this stream's blocking calls from any
            /// thread (see [`Canceller`]).
            pub fn canceller(&self) -> Canceller {
                self.state.canceller()
            }

            /// The pending socket error, if any (`SO_ERROR`).
            pub fn take_error(&self) -> io::Result<Option<io::Error>> {
                self.sock.take_error()
            }
        }

        impl Read for $t {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                <$t>::read(self, buf)
            }
            fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                <$t>::read_vectored(self, bufs)
            }
        }

        impl Read for &$t {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                <$t>::read(self, buf)
            }
            fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                <$t>::read_vectored(self, bufs)
            }
        }

        impl Write for $t {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                <$t>::write(self, buf)
            }
            fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                <$t>::write_vectored(self, bufs)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        impl Write for &$t {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                <$t>::write(self, buf)
            }
            fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                <$t>::write_vectored(self, bufs)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }

        impl AsRawFd for $t {
            fn as_raw_fd(&self) -> RawFd {
                self.sock.as_raw_fd()
            }
        }

        impl AsFd for $t {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.sock.as_fd()
            }
        }
    };
}

/// A TCP listener.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let addr = l.local_addr().unwrap();
///     let c = corewise::spawn(move || corewise::net::TcpStream::connect(addr).unwrap()).unwrap();
///     let (_s, peer) = l.accept().unwrap();
///     assert_eq!(peer, c.join().unwrap().local_addr().unwrap());
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct TcpListener {
    sock: std::net::TcpListener,
    state: IoState,
}

impl TcpListener {
    /// Binds to `addr` (the first address that works) and listens, with
    /// `SO_REUSEADDR` and a backlog of 4096.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Self> {
        each_addr(addr, |a| {
            let fd = new_socket(family(a), SocketType::STREAM)?;
            rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
            rustix::net::bind(&fd, a)?;
            rustix::net::listen(&fd, BACKLOG)?;
            Ok(Self {
                sock: std::net::TcpListener::from(fd),
                state: IoState::default(),
            })
        })
    }

    /// Waits for a connection; the new stream is non-blocking internally
    /// (its calls block the user thread only).
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&addr) as libc::socklen_t;
        let kind = Kind::Accept {
            fd: self.sock.as_raw_fd(),
            addr: &mut addr,
            len: &mut len,
        };
        // SAFETY: `addr`/`len` live on this stack until the call returns,
        // which is after the kernel wrote them.
        let fd = unsafe { self.state.read(kind) }?;
        // SAFETY: accept returned a new fd that nobody else owns.
        let s = unsafe { std::net::TcpStream::from_raw_fd(fd as RawFd) };
        Ok((TcpStream::from_std_nonblocking(s), sockaddr_to_std(&addr)?))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Timeout of each `accept` (`None`: wait forever).
    pub fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// A handle that cancels pending `accept`s from any thread.
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl AsFd for TcpListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A TCP connection.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let addr = l.local_addr().unwrap();
///     let echo = corewise::spawn(move || {
///         let (mut s, _) = l.accept().unwrap();
///         let mut b = [0u8; 5];
///         s.read_exact(&mut b).unwrap();
///         s.write_all(&b).unwrap();
///     }).unwrap();
///     let mut c = corewise::net::TcpStream::connect(addr).unwrap();
///     c.set_nodelay(true).unwrap();
///     c.write_all(b"hello").unwrap();
///     let mut b = [0u8; 5];
///     c.read_exact(&mut b).unwrap();
///     assert_eq!(&b, b"hello");
///     echo.join().unwrap();
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct TcpStream {
    sock: std::net::TcpStream,
    state: IoState,
}

impl TcpStream {
    pub(crate) fn from_std_nonblocking(sock: std::net::TcpStream) -> Self {
        Self {
            sock,
            state: IoState::default(),
        }
    }

    /// Connects to `addr` (each address in turn).
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Self> {
        each_addr(addr, |a| Self::connect_inner(a, None))
    }

    /// Connects to `addr`, giving up after `timeout`.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<Self> {
        Self::connect_inner(addr, Some(Instant::now() + timeout))
    }

    fn connect_inner(a: &SocketAddr, deadline: Option<Instant>) -> io::Result<Self> {
        let fd = new_socket(family(a), SocketType::STREAM)?;
        let state = IoState::default();
        connect_fd(&fd, a, &state, deadline)?;
        Ok(Self {
            sock: std::net::TcpStream::from(fd),
            state,
        })
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.sock.set_nodelay(on)
    }

    /// Whether `TCP_NODELAY` is set.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.sock.nodelay()
    }

    /// A second handle to the same connection (its own timeouts and
    /// cancel state).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self::from_std_nonblocking(self.sock.try_clone()?))
    }
}

stream_methods!(TcpStream);

/// A UDP socket.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
///     let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
///     a.send_to(b"ping", b.local_addr().unwrap()).unwrap();
///     let mut buf = [0u8; 16];
///     let (n, from) = b.recv_from(&mut buf).unwrap();
///     assert_eq!((&buf[..n], from), (&b"ping"[..], a.local_addr().unwrap()));
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct UdpSocket {
    sock: std::net::UdpSocket,
    state: IoState,
}

impl UdpSocket {
    /// Binds to `addr`.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Self> {
        each_addr(addr, |a| {
            let fd = new_socket(family(a), SocketType::DGRAM)?;
            rustix::net::bind(&fd, a)?;
            Ok(Self {
                sock: std::net::UdpSocket::from(fd),
                state: IoState::default(),
            })
        })
    }

    /// Sets the default peer (no system call blocks here).
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        self.sock.connect(addr)
    }

    /// Sends to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let kind = Kind::Send {
            fd: self.sock.as_raw_fd(),
            buf: buf.as_ptr(),
            len: buf.len(),
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.write(kind) }
    }

    /// Receives from the connected peer.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let kind = Kind::Recv {
            fd: self.sock.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            flags: 0,
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.read(kind) }
    }

    /// Sends one datagram to `addr`.
    pub fn send_to(&self, buf: &[u8], addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to send to"))?;
        let (mut name, namelen) = std_to_sockaddr(&addr);
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut _,
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = namelen;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let kind = Kind::SendMsg {
            fd: self.sock.as_raw_fd(),
            msg: &msg,
        };
        // SAFETY: msg, name, iov and buf live until the call returns.
        unsafe { self.state.write(kind) }
    }

    /// Receives one datagram and its sender.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of_val(&name) as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let kind = Kind::RecvMsg {
            fd: self.sock.as_raw_fd(),
            msg: &mut msg,
        };
        // SAFETY: msg, name, iov and buf live until the call returns.
        let n = unsafe { self.state.read(kind) }?;
        Ok((n, sockaddr_to_std(&name)?))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// Timeout of each receive.
    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// Timeout of each send.
    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_write_timeout(d)
    }

    /// A handle that cancels this socket's blocking calls from any thread.
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// A Unix-domain stream listener.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let p = std::env::temp_dir().join(format!("cw-doc-{}.sock", std::process::id()));
///     let _ = std::fs::remove_file(&p);
///     let l = corewise::net::UnixListener::bind(&p).unwrap();
///     let p2 = p.clone();
///     let c = corewise::spawn(move || corewise::net::UnixStream::connect(&p2).unwrap()).unwrap();
///     let (_s, _addr) = l.accept().unwrap();
///     c.join().unwrap();
///     std::fs::remove_file(&p).unwrap();
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct UnixListener {
    sock: std::os::unix::net::UnixListener,
    state: IoState,
}

impl UnixListener {
    /// Binds to `path` and listens.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = new_socket(AddressFamily::UNIX, SocketType::STREAM)?;
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        rustix::net::bind(&fd, &addr)?;
        rustix::net::listen(&fd, BACKLOG)?;
        Ok(Self {
            sock: std::os::unix::net::UnixListener::from(fd),
            state: IoState::default(),
        })
    }

    /// Waits for a connection.
    pub fn accept(&self) -> io::Result<(UnixStream, std::os::unix::net::SocketAddr)> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&addr) as libc::socklen_t;
        let kind = Kind::Accept {
            fd: self.sock.as_raw_fd(),
            addr: &mut addr,
            len: &mut len,
        };
        // SAFETY: `addr`/`len` live until the call returns.
        let fd = unsafe { self.state.read(kind) }?;
        // SAFETY: a new fd from accept, owned by nobody else.
        let s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd as RawFd) };
        let peer = s.peer_addr()?;
        Ok((UnixStream::from_std_nonblocking(s), peer))
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        self.sock.local_addr()
    }

    /// Timeout of each `accept`.
    pub fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// A handle that cancels pending `accept`s from any thread.
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
    }
}

impl AsRawFd for UnixListener {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// A Unix-domain stream connection.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let (mut a, mut b) = corewise::net::UnixStream::pair().unwrap();
///     a.write_all(b"ok").unwrap();
///     let mut buf = [0u8; 2];
///     b.read_exact(&mut buf).unwrap();
///     assert_eq!(&buf, b"ok");
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct UnixStream {
    sock: std::os::unix::net::UnixStream,
    state: IoState,
}

impl UnixStream {
    fn from_std_nonblocking(sock: std::os::unix::net::UnixStream) -> Self {
        Self {
            sock,
            state: IoState::default(),
        }
    }

    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = new_socket(AddressFamily::UNIX, SocketType::STREAM)?;
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        let state = IoState::default();
        connect_fd(&fd, &addr, &state, None)?;
        Ok(Self {
            sock: std::os::unix::net::UnixStream::from(fd),
            state,
        })
    }

    /// A connected pair.
    pub fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((
            Self::from_std_nonblocking(a.into()),
            Self::from_std_nonblocking(b.into()),
        ))
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        self.sock.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<std::os::unix::net::SocketAddr> {
        self.sock.local_addr()
    }
}

stream_methods!(UnixStream);
